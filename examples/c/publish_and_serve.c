/* libtern end to end (docs/embedding.md): a root and a member agent in this
 * process on 127.0.0.1, two checkpoint versions published (one in-process,
 * one through the root's admin port, as a scheduler would), the member's
 * served events from a subscription, and the status once the member serves
 * the second.
 *
 *   publish_and_serve [WORKDIR]    (default: a fresh directory under /tmp)
 *
 * Exit status 0 when the member served both versions. Plain TCP is for this
 * demonstration on loopback; across machines use "tcp+tls" (the default). */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tern/tern.h"
#include "tiny_safetensors.h"

#define TOKEN "example-admin-token"

static void log_line(void* user, const char* line) {
  if (getenv("TERN_EXAMPLE_VERBOSE") != NULL) fprintf(stderr, "[%s] %s\n", (const char*)user, line);
}

/* The member's events, as a subscription delivers them (on its thread). */
static void on_event(void* user, const tern_event* e) {
  (void)user;
  if (e->kind == TERN_EVENT_VERSION_SERVED)
    printf("event %llu: %s %llu in %s (%s)\n", (unsigned long long)e->seq,
           tern_event_kind_name(e->kind), (unsigned long long)e->version, e->slot_dir,
           e->all_tensors ? "a whole view" : "a patch");
}

static int fail(const char* what, tern_code code) {
  fprintf(stderr, "publish_and_serve: %s: %s (%s)\n", what, tern_last_error(),
          tern_code_name(code));
  return 1;
}

static int remove_entry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  (void)st, (void)type, (void)ftw;
  return remove(path);
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Polls the member until it serves `version` (30 s at most). */
static tern_code wait_served(tern_agent* member, uint64_t version) {
  tern_status st;
  for (int i = 0; i < 600; ++i) {
    st.struct_size = sizeof st;
    tern_code c = tern_agent_status(member, &st);
    if (c != TERN_OK) return c;
    if (st.served_version >= version) return TERN_OK;
    sleep_ms(50);
  }
  return TERN_TIMEOUT;
}

int main(int argc, char** argv) {
  if (!TERN_ABI_COMPATIBLE(tern_abi_version())) {
    fprintf(stderr, "libtern %s implements ABI %lx; this program needs %x\n", tern_version(),
            (unsigned long)tern_abi_version(), TERN_ABI_VERSION);
    return 1;
  }
  char dir[256] = "/tmp/tern-example-XXXXXX";
  const int own_dir = argc <= 1;
  if (argc > 1) {
    snprintf(dir, sizeof dir, "%s", argv[1]);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
      perror(dir);
      return 1;
    }
  } else if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  char root_dir[300], member_dir[300], v1[300], v2[300];
  snprintf(root_dir, sizeof root_dir, "%s/root", dir);
  snprintf(member_dir, sizeof member_dir, "%s/member", dir);
  snprintf(v1, sizeof v1, "%s/v1.safetensors", dir);
  snprintf(v2, sizeof v2, "%s/v2.safetensors", dir);
  if (tiny_write_checkpoint(v1, 1u << 16, 1) != 0 || tiny_write_checkpoint(v2, 1u << 16, 2) != 0) {
    fprintf(stderr, "publish_and_serve: cannot write checkpoints in %s\n", dir);
    return 1;
  }

  /* The root: plain TCP on loopback, an admin port with a token. */
  tern_agent_options o;
  tern_agent_options_init(&o);
  o.root = 1;
  o.listen = "127.0.0.1:0";
  o.admin_listen = "127.0.0.1:0";
  o.admin_token = TOKEN;
  o.data_dir = root_dir;
  o.transport = "tcp";
  o.log = log_line;
  o.log_user = "root";
  tern_agent* root = NULL;
  tern_code c = tern_agent_start(&o, &root);
  if (c != TERN_OK) return fail("start the root", c);

  char root_address[128], admin_address[128], key[4096];
  size_t len = 0;
  if ((c = tern_agent_listen_address(root, root_address, sizeof root_address, &len)) != TERN_OK ||
      (c = tern_agent_admin_address(root, admin_address, sizeof admin_address, &len)) != TERN_OK ||
      (c = tern_agent_public_key_pem(root, key, sizeof key, &len)) != TERN_OK)
    return fail("read the root's addresses and key", c);

  /* A member that joins it and trusts its key. */
  const char* keys[1] = {key};
  tern_agent_options_init(&o);
  o.join = root_address;
  o.listen = "127.0.0.1:0";
  o.data_dir = member_dir;
  o.trusted_keys_pem = keys;
  o.trusted_keys_count = 1;
  o.transport = "tcp";
  o.log = log_line;
  o.log_user = "member";
  tern_agent* member = NULL;
  if ((c = tern_agent_start(&o, &member)) != TERN_OK) return fail("start the member", c);
  tern_subscription* events = NULL;
  if ((c = tern_agent_subscribe(member, 0, on_event, NULL, &events)) != TERN_OK)
    return fail("subscribe to the member's events", c);

  /* Version 1 in-process; the call returns once it is on the board. */
  if ((c = tern_agent_publish(root, v1, 1)) != TERN_OK) return fail("publish version 1", c);
  if ((c = wait_served(member, 1)) != TERN_OK) return fail("wait for version 1", c);
  printf("member serves version 1\n");

  /* Version 2 through the admin port, as a scheduler elsewhere would. */
  tern_client_options co;
  tern_client_options_init(&co);
  co.token = TOKEN;
  co.timeout_ms = 60000;
  tern_client* client = NULL;
  if ((c = tern_client_open(admin_address, &co, &client)) != TERN_OK)
    return fail("open a client", c);
  if ((c = tern_client_publish(client, v2, 2)) != TERN_OK) return fail("publish version 2", c);
  /* ... and, with no handle on the members, waits until the root hears
   * from every member that it serves HEAD (30 s at most). */
  tern_status st;
  for (int i = 0;; ++i) {
    st.struct_size = sizeof st;
    if ((c = tern_client_status(client, &st)) != TERN_OK) return fail("read the root's status", c);
    if (st.head == 2 && st.member_count == 1 && st.members_at_head == st.member_count) break;
    if (i == 600) return fail("wait for version 2", TERN_TIMEOUT);
    sleep_ms(50);
  }
  printf("root: HEAD %llu, %u of %u member(s) serve it, %u version(s) kept\n",
         (unsigned long long)st.head, st.members_at_head, st.member_count, st.version_count);
  /* Text out: ask the size, then read; a live agent's status can grow
     between the two calls (a beacon's age, a counter), so ask again then. */
  char* json = NULL;
  if ((c = tern_agent_status_json(member, NULL, 0, &len)) != TERN_RESOURCE_EXHAUSTED)
    return fail("size the member's status", c);
  for (int tries = 0; tries < 5; ++tries) {
    char* grown = realloc(json, len + 1);
    if (grown == NULL) {
      free(json);
      return 1;
    }
    json = grown;
    c = tern_agent_status_json(member, json, len + 1, &len);
    if (c != TERN_RESOURCE_EXHAUSTED) break;
  }
  if (c != TERN_OK) {
    free(json);
    return fail("read status", c);
  }
  printf("member status:\n%s", json);
  free(json);

  tern_client_free(client);
  tern_subscription_free(events); /* before its agent */
  tern_agent_free(member);
  tern_agent_free(root);
  printf("member serves version 2\n");
  if (own_dir) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}
