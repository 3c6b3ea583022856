/* The C API from a C99 translation unit (include/tern/tern.h): versions,
 * codes and the per-thread last error; every refusal a caller can provoke
 * (NULL pointers, bad options, versioned structs of the wrong size, the
 * wrong handle, buffers too small); then a root and a member on 127.0.0.1,
 * publishing in-process and through the admin port (token checked), status,
 * metrics and publish jobs, and the handle after stop; trainer ranks
 * publishing their shards through the admin port. Prints each failed
 * check with its line and exits 1. */
#define _XOPEN_SOURCE 700

#include <ftw.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tern/tern.h"
#include "tiny_safetensors.h"

static int failures = 0;

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "capi_test.c:%d: CHECK(%s) failed; last error: %s\n", __LINE__, #cond, \
              tern_last_error());                                                            \
      ++failures;                                                                            \
    }                                                                                        \
  } while (0)
/* A call's code, and its message naming `needle` when it failed. */
#define CHECK_CODE(call, want, needle)                                                          \
  do {                                                                                          \
    tern_code got_ = (call);                                                                    \
    if (got_ != (want) || strstr(tern_last_error(), (needle)) == NULL) {                        \
      fprintf(stderr, "capi_test.c:%d: %s: got %s (\"%s\"), want %s naming \"%s\"\n", __LINE__, \
              #call, tern_code_name(got_), tern_last_error(), tern_code_name(want), needle);    \
      ++failures;                                                                               \
    }                                                                                           \
  } while (0)

/* The agents' log lines: counted, and those naming a publish noted. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int log_lines = 0, log_published = 0;
static void quiet(void* user, const char* line) {
  (void)user;
  pthread_mutex_lock(&log_mu);
  ++log_lines;
  if (strstr(line, "published version") != NULL) ++log_published;
  pthread_mutex_unlock(&log_mu);
}

/* Polls an agent from another thread until it answers TERN_UNAVAILABLE
 * (stopped); any other failure is counted. */
typedef struct {
  tern_agent* agent;
  int polls, errors;
} poller;
static void* poll_until_stopped(void* arg) {
  poller* p = (poller*)arg;
  char json[1 << 14];
  size_t len = 0;
  for (;;) {
    tern_status st;
    st.struct_size = sizeof st;
    tern_code c = tern_agent_status(p->agent, &st);
    if (c == TERN_OK) c = tern_agent_status_json(p->agent, json, sizeof json, &len);
    if (c == TERN_UNAVAILABLE) return NULL;
    if (c != TERN_OK) ++p->errors;
    ++p->polls;
  }
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int remove_entry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  (void)st, (void)type, (void)ftw;
  return remove(path);
}

static void* other_thread(void* arg) {
  /* The last error is per thread: this thread has made no call yet. */
  *(int*)arg = strcmp(tern_last_error(), "") == 0;
  return NULL;
}

/* What a subscription's callback saw: the versions served, in order. */
typedef struct {
  pthread_mutex_t mu;
  uint64_t served[16];
  int count, bad;
} served_log;
static void on_event(void* user, const tern_event* e) {
  served_log* log = (served_log*)user;
  pthread_mutex_lock(&log->mu);
  if (e->kind == TERN_EVENT_VERSION_SERVED && log->count < 16) {
    log->served[log->count++] = e->version;
    /* A served event names its slot and D(version). */
    if (strstr(e->slot_dir, "views/") == NULL || (e->digest[0] | e->digest[1]) == 0) ++log->bad;
  }
  pthread_mutex_unlock(&log->mu);
}

/* Waits for events in another thread, to be ended by tern_agent_stop. */
typedef struct {
  tern_agent* agent;
  uint64_t after_seq; /* the agent's newest event: nothing comes after it */
  tern_code code;
  double seconds;
} waiter;
static void* wait_until_stopped(void* arg) {
  waiter* w = (waiter*)arg;
  const double t0 = now_s();
  tern_events* batch = NULL;
  w->code = tern_agent_wait_events(w->agent, w->after_seq, 8, 60000, &batch);
  w->seconds = now_s() - t0;
  tern_events_free(batch);
  return NULL;
}

static void test_versions_and_codes(void) {
  CHECK(strlen(tern_version()) > 0);
  CHECK(tern_abi_version() == TERN_ABI_VERSION);
  CHECK(TERN_ABI_COMPATIBLE(tern_abi_version()));
  CHECK(!TERN_ABI_COMPATIBLE(tern_abi_version() + (1u << 16)));
  CHECK(strcmp(tern_code_name(TERN_OK), "ok") == 0);
  CHECK(strcmp(tern_code_name(TERN_CORRUPT), "corrupt") == 0);
  CHECK(strcmp(tern_code_name(TERN_AUTH), "authentication") == 0);
  CHECK(strcmp(tern_code_name(-1), "unknown") == 0);
  CHECK(strcmp(tern_code_name(1000), "unknown") == 0);
  CHECK(strcmp(tern_last_error(), "") == 0);
}

static void base_options(tern_agent_options* o, const char* dir) {
  tern_agent_options_init(o);
  o->root = 1;
  o->listen = "127.0.0.1:0";
  o->data_dir = dir;
  o->transport = "tcp";
  o->log = quiet;
}

static void test_bad_options(const char* dir) {
  tern_agent* a = (tern_agent*)&a; /* not NULL: a failed start must set it to NULL */
  tern_agent_options o;
  CHECK_CODE(tern_agent_start(NULL, &a), TERN_INVALID_ARGUMENT, "NULL");
  CHECK(a == NULL);
  base_options(&o, dir);
  CHECK_CODE(tern_agent_start(&o, NULL), TERN_INVALID_ARGUMENT, "out is NULL");

  /* The per-thread message: set here, not seen by another thread. */
  int clean_elsewhere = 0;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread, &clean_elsewhere) == 0);
  pthread_join(t, NULL);
  CHECK(clean_elsewhere);
  CHECK(strlen(tern_last_error()) > 0);

  base_options(&o, dir);
  o.struct_size = 0;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "struct_size");
  o.struct_size = 8;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "struct_size");

  /* A struct from a newer header: unknown fields must be zero. */
  struct {
    tern_agent_options known;
    uint64_t newer_field;
  } newer;
  base_options(&newer.known, dir);
  newer.known.struct_size = sizeof newer;
  newer.known.listen = NULL; /* so that a start that reads it stops there */
  newer.newer_field = 7;
  CHECK_CODE(tern_agent_start(&newer.known, &a), TERN_UNSUPPORTED, "does not know");
  newer.newer_field = 0;
  CHECK_CODE(tern_agent_start(&newer.known, &a), TERN_INVALID_ARGUMENT, "listen is required");

  base_options(&o, dir);
  o.root = 2;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "root is 2");
  base_options(&o, dir);
  o.join = "127.0.0.1:1";
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "join must be NULL");
  base_options(&o, dir);
  o.root = 0;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "needs join");
  o.join = "127.0.0.1:1";
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "trusted_keys_pem");
  o.trusted_keys_count = 65;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_OUT_OF_RANGE, "at most 64");
  o.trusted_keys_count = 1;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "trusted_keys_pem is NULL");
  const char* no_key[1] = {NULL};
  o.trusted_keys_pem = no_key;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "trusted_keys_pem[0] is NULL");

  base_options(&o, dir);
  o.data_dir = NULL;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "data_dir");
  base_options(&o, dir);
  o.patch_format = 3;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "patch_format");
  base_options(&o, dir);
  CHECK(o.patch_nibbles == 1); /* ABI 1.5; the default */
  o.patch_nibbles = 2;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "patch_nibbles is 2");
  base_options(&o, dir);
  o.transport = NULL; /* tcp+tls, the default, needs its files */
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "tls_cert_file");
  o.transport = "carrier-pigeon";
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "carrier-pigeon");
  o.transport = "tcp";
  o.tls_ca_file = "/ca.pem";
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "carries no TLS");
  base_options(&o, dir);
  o.uplink_bytes_per_s = 0;
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "uplink_bytes_per_s");
  base_options(&o, dir);
  o.heartbeat_ms = 0; /* refused by the agent itself, which says why */
  CHECK_CODE(tern_agent_start(&o, &a), TERN_INVALID_ARGUMENT, "heartbeat");
  CHECK(a == NULL);

  /* Handles that are NULL or of the wrong kind. */
  tern_status st;
  st.struct_size = sizeof st;
  size_t len = 0;
  CHECK_CODE(tern_agent_status(NULL, &st), TERN_INVALID_ARGUMENT, "agent is NULL");
  CHECK_CODE(tern_agent_publish(NULL, "/x", 1), TERN_INVALID_ARGUMENT, "agent is NULL");
  CHECK_CODE(tern_agent_stop(NULL), TERN_INVALID_ARGUMENT, "agent is NULL");
  CHECK_CODE(tern_client_status_json(NULL, NULL, 0, &len), TERN_INVALID_ARGUMENT, "client is NULL");
  tern_agent_free(NULL);
  tern_client_free(NULL);

  tern_client* client = NULL;
  CHECK_CODE(tern_client_open(NULL, NULL, &client), TERN_INVALID_ARGUMENT, "admin_address is NULL");
  CHECK_CODE(tern_client_open("127.0.0.1:9", NULL, NULL), TERN_INVALID_ARGUMENT, "out is NULL");
  CHECK_CODE(tern_client_open("no-port", NULL, &client), TERN_INVALID_ARGUMENT, "HOST:PORT");
  CHECK_CODE(tern_client_open("h:99999", NULL, &client), TERN_INVALID_ARGUMENT, "1..65535");
  CHECK_CODE(tern_client_open("h:0", NULL, &client), TERN_INVALID_ARGUMENT, "1..65535");
  tern_client_options co;
  tern_client_options_init(&co);
  co.struct_size = 3;
  CHECK_CODE(tern_client_open("127.0.0.1:9", &co, &client), TERN_INVALID_ARGUMENT, "struct_size");
  tern_client_options_init(&co);
  co.timeout_ms = 0;
  CHECK_CODE(tern_client_open("127.0.0.1:9", &co, &client), TERN_INVALID_ARGUMENT, "timeout_ms");
  CHECK(client == NULL);
  /* ABI 1.1: https:// addresses with a CA; a path after the port is refused. */
  CHECK_CODE(tern_client_open("https://h:1/status", NULL, &client), TERN_INVALID_ARGUMENT,
             "no path");
  tern_client_options_init(&co);
  co.ca_pem = "-----BEGIN CERTIFICATE-----\n";
  CHECK(tern_client_open("https://127.0.0.1:1", &co, &client) == TERN_OK);
  /* The CA is parsed when a call is made: this one holds no certificate. */
  CHECK_CODE(tern_client_status(client, &st), TERN_INVALID_ARGUMENT, "--admin-cacert");
  tern_client_free(client);
  client = NULL;
  /* ABI 1.3: supersede is 0 or 1; a caller built against 1.2 (its struct
   * ends before the field) still opens a client, which does not supersede. */
  tern_client_options_init(&co);
  CHECK(co.supersede == 0);
  co.supersede = 2;
  CHECK_CODE(tern_client_open("127.0.0.1:1", &co, &client), TERN_INVALID_ARGUMENT, "supersede");
  CHECK(client == NULL);
  co.supersede = 1;
  CHECK(tern_client_open("127.0.0.1:1", &co, &client) == TERN_OK);
  tern_client_free(client);
  client = NULL;
  co.struct_size = offsetof(tern_client_options, supersede);
  CHECK(tern_client_open("127.0.0.1:1", &co, &client) == TERN_OK);
  tern_client_free(client);
  client = NULL;

  /* Success clears the last error; a client of the wrong kind is refused. */
  tern_client_options_init(&co);
  co.timeout_ms = 2000;
  CHECK(tern_client_open("127.0.0.1:1", &co, &client) == TERN_OK);
  CHECK(strcmp(tern_last_error(), "") == 0);
  CHECK_CODE(tern_agent_status((tern_agent*)client, &st), TERN_INVALID_ARGUMENT,
             "not a tern_agent");
  /* Nobody listens on port 1. */
  CHECK_CODE(tern_client_status(client, &st), TERN_UNAVAILABLE, "");
  tern_client_free(client);
}

/* Waits until `member` serves `version` (30 s at most). */
static int wait_served(tern_agent* member, uint64_t version) {
  for (int i = 0; i < 600; ++i) {
    tern_status st;
    st.struct_size = sizeof st;
    if (tern_agent_status(member, &st) != TERN_OK) return 0;
    if (st.served_version >= version) return 1;
    sleep_ms(50);
  }
  return 0;
}

/* n tiny checkpoints DIR/PREFIX1.safetensors .. DIR/PREFIXn.safetensors of
 * 4096 values, written with steps first_step, first_step + 1, ...; their
 * paths in path[0..n-1]. */
static void write_checkpoints(const char* dir, const char* prefix, uint32_t first_step, int n,
                              char (*path)[300]) {
  for (int i = 0; i < n; ++i) {
    snprintf(path[i], 300, "%s/%s%d.safetensors", dir, prefix, i + 1);
    CHECK(tiny_write_checkpoint(path[i], 4096, first_step + (uint32_t)i) == 0);
  }
}

static void test_agents(const char* dir) {
  char root_dir[300], member_dir[300], v[2][300];
  snprintf(root_dir, sizeof root_dir, "%s/root", dir);
  snprintf(member_dir, sizeof member_dir, "%s/member", dir);
  write_checkpoints(dir, "v", 1, 2, v);
  const char* v1 = v[0];
  const char* v2 = v[1];

  tern_agent_options o;
  base_options(&o, root_dir);
  o.admin_listen = "127.0.0.1:0";
  o.admin_token = "right";
  tern_agent* root = NULL;
  CHECK(tern_agent_start(&o, &root) == TERN_OK);
  if (root == NULL) return;

  /* Text out: sizing, too small, NULL buffer, NULL len, exact fit. */
  char addr[128], admin[128], key[4096];
  size_t len = 12345;
  CHECK_CODE(tern_agent_listen_address(root, NULL, 0, &len), TERN_RESOURCE_EXHAUSTED, "too small");
  CHECK(len > 0 && len < sizeof addr);
  const size_t need = len;
  CHECK_CODE(tern_agent_listen_address(root, addr, need, &len), TERN_RESOURCE_EXHAUSTED,
             "too small");
  CHECK_CODE(tern_agent_listen_address(root, NULL, 5, &len), TERN_INVALID_ARGUMENT, "buf is NULL");
  CHECK_CODE(tern_agent_listen_address(root, addr, sizeof addr, NULL), TERN_INVALID_ARGUMENT,
             "len is NULL");
  CHECK(tern_agent_listen_address(root, addr, need + 1, &len) == TERN_OK);
  CHECK(len == need && strlen(addr) == need && strncmp(addr, "127.0.0.1:", 10) == 0);
  CHECK(tern_agent_admin_address(root, admin, sizeof admin, &len) == TERN_OK);
  CHECK(tern_agent_public_key_pem(root, key, sizeof key, &len) == TERN_OK);
  CHECK(strstr(key, "BEGIN PUBLIC KEY") != NULL);

  const char* keys[1] = {key};
  base_options(&o, member_dir);
  o.root = 0;
  o.join = addr;
  o.trusted_keys_pem = keys;
  o.trusted_keys_count = 1;
  tern_agent* member = NULL;
  CHECK(tern_agent_start(&o, &member) == TERN_OK);
  if (member == NULL) {
    tern_agent_free(root);
    return;
  }
  /* The callback form, from the start: it sees every version served. */
  served_log served;
  memset(&served, 0, sizeof served);
  pthread_mutex_init(&served.mu, NULL);
  tern_subscription* sub = NULL;
  CHECK_CODE(tern_agent_subscribe(member, 0, NULL, &served, &sub), TERN_INVALID_ARGUMENT,
             "fn is NULL");
  CHECK_CODE(tern_agent_subscribe(NULL, 0, on_event, &served, &sub), TERN_INVALID_ARGUMENT,
             "agent is NULL");
  CHECK(tern_agent_subscribe(member, 0, on_event, &served, &sub) == TERN_OK);
  CHECK_CODE(tern_agent_public_key_pem(member, key, sizeof key, &len), TERN_NOT_FOUND,
             "only a root");
  CHECK_CODE(tern_agent_publish(member, v1, 1), TERN_INVALID_ARGUMENT, "not the root");
  CHECK_CODE(tern_agent_publish(root, NULL, 1), TERN_INVALID_ARGUMENT, "checkpoint_path is NULL");
  CHECK(tern_agent_publish(root, "/nonexistent/ckpt.safetensors", 1) != TERN_OK);

  /* In-process publish. */
  CHECK(tern_agent_publish(root, v1, 1) == TERN_OK);
  CHECK_CODE(tern_agent_publish(root, v1, 1), TERN_INVALID_ARGUMENT, "not newer than HEAD");
  CHECK(wait_served(member, 1));

  /* A relay-only member: it forwards and serves nothing, so the root counts
   * it among its members but never among those serving HEAD. */
  char relay_dir[300];
  snprintf(relay_dir, sizeof relay_dir, "%s/relay", dir);
  base_options(&o, relay_dir);
  o.root = 0;
  o.join = addr;
  o.trusted_keys_pem = keys;
  o.trusted_keys_count = 1;
  o.relay_only = 1;
  tern_agent* relay = NULL;
  CHECK(tern_agent_start(&o, &relay) == TERN_OK);

  /* Result structs: too small refused; larger ones written only as far as
   * this library knows. */
  struct {
    tern_status known;
    uint64_t newer_field;
  } big;
  memset(&big, 0xab, sizeof big);
  big.known.struct_size = sizeof big;
  CHECK(tern_agent_status(root, &big.known) == TERN_OK);
  CHECK(big.known.struct_size == sizeof big);
  CHECK(big.newer_field == 0xababababababababull);
  CHECK(big.known.root == 1 && big.known.head == 1 && big.known.served_version == 1);
  CHECK(big.known.member_count == 1 && big.known.version_count == 1);
  tern_status st;
  st.struct_size = offsetof(tern_status, members_at_head); /* one field short of ABI 1.0 */
  CHECK_CODE(tern_agent_status(root, &st), TERN_INVALID_ARGUMENT, "struct_size");
  CHECK_CODE(tern_agent_status(root, NULL), TERN_INVALID_ARGUMENT, "out is NULL");
  st.struct_size = sizeof st;
  CHECK(tern_agent_status(member, &st) == TERN_OK);
  CHECK(st.root == 0 && st.joined == 1 && st.served_version == 1 && st.member_count == 0);

  /* Through the admin port: a wrong token is refused, the right one publishes. */
  tern_client_options co;
  tern_client_options_init(&co);
  co.token = "wrong";
  co.timeout_ms = 60000;
  tern_client* bad = NULL;
  CHECK(tern_client_open(admin, &co, &bad) == TERN_OK);
  CHECK_CODE(tern_client_publish(bad, v2, 2), TERN_AUTH, "token");
  CHECK_CODE(tern_client_events_json(bad, 0, 8, 0, NULL, 0, &len), TERN_AUTH, "token");
  tern_client_free(bad);
  co.token = "right";
  tern_client* client = NULL;
  CHECK(tern_client_open(admin, &co, &client) == TERN_OK);
  CHECK_CODE(tern_client_publish(client, NULL, 2), TERN_INVALID_ARGUMENT,
             "checkpoint_path is NULL");
  CHECK(tern_client_publish(client, v2, 2) == TERN_OK);
  CHECK(wait_served(member, 2));
  CHECK_CODE(tern_client_publish(client, v2, 2), TERN_INVALID_ARGUMENT, "not newer than HEAD");

  /* The root learns the member's version from its heartbeats. */
  for (int i = 0; i < 600; ++i) {
    st.struct_size = sizeof st;
    CHECK(tern_client_status(client, &st) == TERN_OK);
    if (st.members_at_head == 1 && st.member_count == 2) break;
    sleep_ms(50);
  }
  CHECK(st.root == 1 && st.head == 2 && st.served_version == 2 && st.member_count == 2);
  CHECK(st.members_at_head == 1);
  tern_status in_process;
  in_process.struct_size = sizeof in_process;
  CHECK(tern_agent_status(root, &in_process) == TERN_OK);
  CHECK(in_process.head == 2 && in_process.members_at_head == 1 && in_process.member_count == 2);
  if (relay != NULL) {
    in_process.struct_size = sizeof in_process;
    CHECK(tern_agent_status(relay, &in_process) == TERN_OK);
    CHECK(in_process.relay_only == 1 && in_process.served_version == 0);
    tern_agent_free(relay);
  }
  char* text = malloc(1 << 20);
  CHECK(text != NULL);
  if (text != NULL) {
    CHECK(tern_client_status_json(client, text, 1 << 20, &len) == TERN_OK);
    CHECK(strstr(text, "\"head\": 2") != NULL && strlen(text) == len);
    CHECK(tern_client_metrics(client, text, 1 << 20, &len) == TERN_OK);
    CHECK(strstr(text, "tern_") != NULL);
    CHECK(tern_client_publish_jobs_json(client, text, 1 << 20, &len) == TERN_OK);
    CHECK(strstr(text, "\"published\"") != NULL);
    CHECK_CODE(tern_client_metrics(client, text, 4, &len), TERN_RESOURCE_EXHAUSTED, "too small");
    CHECK(tern_client_events_json(client, 0, 1024, 0, text, 1 << 20, &len) == TERN_OK);
    CHECK(strstr(text, "\"version_published\"") != NULL && strstr(text, "\"last_seq\"") != NULL);
    CHECK_CODE(tern_client_events_json(client, 0, 0, 0, text, 1 << 20, &len), TERN_OUT_OF_RANGE,
               "max_events");
    CHECK_CODE(tern_client_events_json(client, 0, 8, 5001, text, 1 << 20, &len), TERN_OUT_OF_RANGE,
               "timeout_ms");
    CHECK(tern_agent_status_json(member, text, 1 << 20, &len) == TERN_OK);
    CHECK(strstr(text, "\"role\": \"member\"") != NULL &&
          strstr(text, "\"served_version\": 2") != NULL);
    free(text);
  }
  /* Operator calls (ABI 1.1): through the port and in-process. */
  char member_id[128];
  CHECK(tern_agent_listen_address(member, member_id, sizeof member_id, &len) == TERN_OK);
  CHECK(tern_client_drain_member(client, member_id) == TERN_OK);
  CHECK(tern_client_drain_member(client, member_id) == TERN_OK); /* again: no change */
  CHECK_CODE(tern_client_drain_member(client, "ghost"), TERN_NOT_FOUND, "not joined");
  CHECK_CODE(tern_client_remove_member(client, "ghost", 0), TERN_NOT_FOUND, "not joined");
  CHECK(tern_client_set_retention(client, 4, 8) == TERN_OK);
  CHECK_CODE(tern_client_set_retention(client, 0, 8), TERN_INVALID_ARGUMENT, "keep_patches");
  CHECK(tern_agent_set_retention(root, 16, 32) == TERN_OK);
  CHECK_CODE(tern_agent_set_retention(root, 16, 0), TERN_INVALID_ARGUMENT, "at least 1");
  CHECK_CODE(tern_agent_drain_member(root, "ghost"), TERN_NOT_FOUND, "not joined");
  CHECK_CODE(tern_agent_remove_member(root, "ghost", 86400001), TERN_OUT_OF_RANGE, "more than a day");
  CHECK_CODE(tern_agent_drain_member(member, member_id), TERN_INVALID_ARGUMENT, "not the root");
  CHECK(strcmp(tern_event_kind_name(TERN_EVENT_MEMBER_DRAINED), "member_drained") == 0);
  CHECK(strcmp(tern_event_kind_name(TERN_EVENT_MEMBER_REMOVED), "member_removed") == 0);
  tern_client_free(client);

  /* The subscription saw versions 1 and 2 served, in order. */
  for (int i = 0; i < 100; ++i) {
    pthread_mutex_lock(&served.mu);
    const int n = served.count;
    pthread_mutex_unlock(&served.mu);
    if (n >= 2) break;
    sleep_ms(50);
  }
  pthread_mutex_lock(&served.mu);
  CHECK(served.count == 2 && served.served[0] == 1 && served.served[1] == 2 && served.bad == 0);
  pthread_mutex_unlock(&served.mu);

  /* The polling form on the root: what it published and who joined. */
  tern_events* batch = NULL;
  CHECK_CODE(tern_agent_wait_events(root, 0, 0, 10, &batch), TERN_OUT_OF_RANGE, "max_events");
  CHECK_CODE(tern_agent_wait_events(root, 0, 8, 600001, &batch), TERN_OUT_OF_RANGE, "timeout_ms");
  CHECK_CODE(tern_agent_wait_events(root, 0, 8, 10, NULL), TERN_INVALID_ARGUMENT, "out is NULL");
  CHECK(batch == NULL && tern_events_count(NULL) == 0);
  CHECK(strcmp(tern_event_kind_name(TERN_EVENT_VERSION_SERVED), "version_served") == 0);
  CHECK(strcmp(tern_event_kind_name(99), "unknown") == 0);
  CHECK(tern_agent_wait_events(root, 0, 1024, 1000, &batch) == TERN_OK);
  int published_first = 0, published_second = 0, joined = 0;
  uint64_t last_seq = 0;
  for (size_t i = 0; i < tern_events_count(batch); ++i) {
    tern_event e;
    e.struct_size = sizeof e;
    CHECK(tern_events_get(batch, i, &e) == TERN_OK);
    CHECK(e.seq > last_seq);
    last_seq = e.seq;
    if (e.kind == TERN_EVENT_VERSION_PUBLISHED && e.version == 1 && e.all_tensors)
      ++published_first;
    if (e.kind == TERN_EVENT_VERSION_PUBLISHED && e.version == 2 && !e.all_tensors &&
        e.changed_tensor_count == 1 && strcmp(e.changed_tensors[0], "model.w") == 0)
      ++published_second;
    if (e.kind == TERN_EVENT_MEMBER_JOINED) ++joined;
  }
  CHECK(published_first == 1 && published_second == 1 && joined >= 2);
  tern_event e;
  e.struct_size = sizeof e;
  CHECK_CODE(tern_events_get(batch, tern_events_count(batch), &e), TERN_OUT_OF_RANGE, "index");
  e.struct_size = 0;
  CHECK_CODE(tern_events_get(batch, 0, &e), TERN_INVALID_ARGUMENT, "struct_size");
  CHECK_CODE(tern_events_get(NULL, 0, &e), TERN_INVALID_ARGUMENT, "events is NULL");
  tern_events_free(batch);
  /* Nothing newer: an empty batch once the timeout passes. */
  const double wait_start_s = now_s();
  CHECK(tern_agent_wait_events(root, last_seq, 8, 300, &batch) == TERN_OK);
  CHECK(tern_events_count(batch) == 0 && now_s() - wait_start_s >= 0.25);
  tern_events_free(batch);

  /* After stop: refused, stop again is fine, free last. */
  pthread_mutex_lock(&log_mu);
  CHECK(log_lines > 0 && log_published == 2);
  pthread_mutex_unlock(&log_mu);

  /* Calls from several threads while the handle is stopped under them: each
   * either answers or says the agent is stopped. */
  poller pollers[4];
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i) {
    pollers[i].agent = member;
    pollers[i].polls = pollers[i].errors = 0;
    CHECK(pthread_create(&threads[i], NULL, poll_until_stopped, &pollers[i]) == 0);
  }
  waiter w = {member, 0, TERN_OK, 0};
  CHECK(tern_agent_wait_events(member, 0, 1024, 0, &batch) == TERN_OK);
  for (size_t i = 0; i < tern_events_count(batch); ++i) {
    e.struct_size = sizeof e;
    CHECK(tern_events_get(batch, i, &e) == TERN_OK);
    w.after_seq = e.seq;
  }
  tern_events_free(batch);
  CHECK(w.after_seq >= 2); /* served 1 and 2 at least */
  pthread_t waiting;
  CHECK(pthread_create(&waiting, NULL, wait_until_stopped, &w) == 0);
  sleep_ms(200);
  /* Pollers in tight loops must not starve stop (a reader-preferring lock
   * did: 100 s under ASan). */
  const double stop_start_s = now_s();
  CHECK(tern_agent_stop(member) == TERN_OK);
  CHECK(now_s() - stop_start_s < 10);
  for (int i = 0; i < 4; ++i) {
    pthread_join(threads[i], NULL);
    CHECK(pollers[i].polls > 0 && pollers[i].errors == 0);
  }
  /* A 60 s event wait ends with the stop. */
  pthread_join(waiting, NULL);
  CHECK(w.code == TERN_UNAVAILABLE && w.seconds < 10);
  CHECK_CODE(tern_agent_status(member, &st), TERN_UNAVAILABLE, "stopped");
  CHECK_CODE(tern_agent_publish(member, v2, 3), TERN_UNAVAILABLE, "stopped");
  tern_subscription* refused = NULL;
  CHECK_CODE(tern_agent_subscribe(member, 0, on_event, &served, &refused), TERN_UNAVAILABLE,
             "stopped");
  CHECK(refused == NULL);
  tern_subscription_free(sub); /* its thread ended with the agent */
  pthread_mutex_destroy(&served.mu);
  CHECK(tern_agent_stop(member) == TERN_OK);
  tern_agent_free(member);
  tern_agent_free(root);
}

/* The last `n` bytes of a file (a one-tensor checkpoint's data) equal `want`. */
static int file_ends_with(const char* path, const void* want, size_t n) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return 0;
  unsigned char* got = malloc(n);
  int ok = got != NULL && fseek(f, -(long)n, SEEK_END) == 0 && fread(got, 1, n, f) == n &&
           memcmp(got, want, n) == 0;
  free(got);
  fclose(f);
  return ok;
}

/* A root (with an admin port when token is not NULL) and one member that
 * joined it trusting the root's key, in DIR/NAME-root and DIR/NAME-member.
 * 0 when the root did not start (nothing to free); the member may be NULL
 * (a failed CHECK says so). */
struct fleet {
  tern_agent* root;
  tern_agent* member;
  char admin[128]; /* the root's admin address, when token was given */
  char member_dir[300];
};

static int fleet_start(const char* dir, const char* name, const char* token, struct fleet* f) {
  memset(f, 0, sizeof *f);
  char root_dir[300];
  snprintf(root_dir, sizeof root_dir, "%s/%s-root", dir, name);
  snprintf(f->member_dir, sizeof f->member_dir, "%s/%s-member", dir, name);
  tern_agent_options o;
  base_options(&o, root_dir);
  if (token != NULL) {
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = token;
  }
  CHECK(tern_agent_start(&o, &f->root) == TERN_OK);
  if (f->root == NULL) return 0;
  char addr[128], key[4096];
  size_t len = 0;
  CHECK(tern_agent_listen_address(f->root, addr, sizeof addr, &len) == TERN_OK);
  if (token != NULL)
    CHECK(tern_agent_admin_address(f->root, f->admin, sizeof f->admin, &len) == TERN_OK);
  CHECK(tern_agent_public_key_pem(f->root, key, sizeof key, &len) == TERN_OK);
  const char* keys[1] = {key};
  base_options(&o, f->member_dir);
  o.root = 0;
  o.join = addr;
  o.trusted_keys_pem = keys;
  o.trusted_keys_count = 1;
  CHECK(tern_agent_start(&o, &f->member) == TERN_OK);
  return 1;
}

static void fleet_free(struct fleet* f) {
  if (f->member != NULL) tern_agent_free(f->member);
  tern_agent_free(f->root);
}

/* Publishing from the caller's memory: refusals naming what is wrong, then
 * two versions that reach a member bit for bit. */
static int served_event_epoch(tern_agent* agent, int kind, uint64_t version, uint32_t* epoch,
                              uint64_t* digest);

static void test_publish_tensors(const char* dir) {
  enum { kCount = 4096 };
  char served[340];
  struct fleet f;
  if (!fleet_start(dir, "mem", NULL, &f)) return;
  tern_agent* root = f.root;
  tern_agent* member = f.member;
  snprintf(served, sizeof served, "%s/current/model.safetensors", f.member_dir);

  /* The weights, as a trainer holds them: one BF16 tensor in its memory. */
  static uint16_t w[kCount];
  for (uint32_t i = 0; i < kCount; ++i) w[i] = tiny_bf16((float)(i % 251u) / 64.0f);
  const uint64_t shape[1] = {kCount};
  tern_tensor t[2];
  tern_tensor_init(&t[0]);
  t[0].name = "model.w";
  t[0].dtype = "BF16";
  t[0].shape = shape;
  t[0].ndim = 1;
  t[0].data = w;
  t[0].bytes = sizeof w;
  t[1] = t[0];
  t[1].name = "model.other";

  CHECK_CODE(tern_agent_publish_tensors(root, 1, NULL, 1), TERN_INVALID_ARGUMENT, "tensors is NULL");
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 0), TERN_INVALID_ARGUMENT, "count 0");
  CHECK_CODE(tern_agent_publish_tensors(NULL, 1, t, 1), TERN_INVALID_ARGUMENT, "agent is NULL");
  if (member != NULL)
    CHECK_CODE(tern_agent_publish_tensors(member, 1, t, 1), TERN_INVALID_ARGUMENT, "not the root");
  t[0].dtype = "BF17";
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 1), TERN_INVALID_ARGUMENT,
             "tensor model.w: unknown dtype 'BF17'");
  t[0].dtype = "BF16";
  t[0].bytes = sizeof w - 2;
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 1), TERN_INVALID_ARGUMENT,
             "tensor model.w has 8190 bytes, but BF16 [4096] is 8192 bytes");
  t[0].bytes = sizeof w;
  t[0].data = NULL;
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 1), TERN_INVALID_ARGUMENT, "null data");
  t[0].data = w;
  t[0].name = NULL;
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 1), TERN_INVALID_ARGUMENT, "tensors[0].name is NULL");
  t[0].name = "model.w";
  t[0].shape = NULL;
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 1), TERN_INVALID_ARGUMENT, "shape is NULL");
  t[0].shape = shape;
  t[1].struct_size = sizeof t[1] + 8;
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 2), TERN_INVALID_ARGUMENT,
             "tensors[1].struct_size");
  t[1].struct_size = sizeof t[1];
  t[1].name = "model.w";
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 2), TERN_INVALID_ARGUMENT, "given twice");

  CHECK(tern_agent_publish_tensors(root, 1, t, 1) == TERN_OK);
  CHECK_CODE(tern_agent_publish_tensors(root, 1, t, 1), TERN_INVALID_ARGUMENT, "not newer than HEAD");
  /* Once a layout is served, another is refused. */
  t[1].name = "model.other";
  CHECK_CODE(tern_agent_publish_tensors(root, 2, t, 2), TERN_MISMATCH,
             "tensor model.other is not in the served layout");
  t[0].dtype = "F16";
  CHECK_CODE(tern_agent_publish_tensors(root, 2, t, 1), TERN_MISMATCH,
             "tensor model.w is F16, the served layout has BF16");
  t[0].dtype = "BF16";
  if (member != NULL) {
    CHECK(wait_served(member, 1));
    CHECK(file_ends_with(served, w, sizeof w));
  }
  /* An optimizer step flips ~1% of the values in place; the next version
   * is published from the same buffer. */
  for (uint32_t i = 0; i < kCount; i += 97) w[i] ^= 1;
  CHECK(tern_agent_publish_tensors(root, 2, t, 1) == TERN_OK);
  tern_status st;
  st.struct_size = sizeof st;
  CHECK(tern_agent_status(root, &st) == TERN_OK);
  CHECK(st.head == 2 && st.served_version == 2);
  if (member != NULL) {
    CHECK(wait_served(member, 2));
    CHECK(file_ends_with(served, w, sizeof w));
  }
  /* ABI 1.4: the digest of tensors in memory is the served version's (the
   * one its signed manifest binds); one flipped bit changes it. */
  uint64_t mine[4], event_digest[4];
  uint32_t epoch = 9;
  CHECK(tern_view_digest(t, 1, mine) == TERN_OK);
  CHECK(served_event_epoch(member != NULL ? member : root, TERN_EVENT_VERSION_SERVED, 2, &epoch,
                           event_digest));
  CHECK(memcmp(mine, event_digest, sizeof mine) == 0);
  w[5] ^= 0x40;
  uint64_t flipped[4];
  CHECK(tern_view_digest(t, 1, flipped) == TERN_OK);
  for (int l = 0; l < 4; ++l) CHECK(flipped[l] != mine[l]); /* every lane moves */
  w[5] ^= 0x40;
  CHECK_CODE(tern_view_digest(NULL, 1, mine), TERN_INVALID_ARGUMENT, "view_digest: tensors is NULL");
  CHECK_CODE(tern_view_digest(t, 0, mine), TERN_INVALID_ARGUMENT, "view_digest: count 0");
  CHECK_CODE(tern_view_digest(t, 1, NULL), TERN_INVALID_ARGUMENT, "view_digest: out is NULL");
  t[1].name = "model.w";
  CHECK_CODE(tern_view_digest(t, 2, mine), TERN_INVALID_ARGUMENT,
             "view_digest: tensor model.w is given twice");
  t[1].name = "model.other";
  t[0].bytes = sizeof w - 2;
  CHECK_CODE(tern_view_digest(t, 1, mine), TERN_INVALID_ARGUMENT,
             "view_digest: tensor model.w has 8190 bytes");
  t[0].bytes = sizeof w;
  fleet_free(&f);
}

/* Trainer ranks (ABI 1.2): two rank publishers, each on its own thread,
 * send their halves of one tensor to the root's admin port; the member
 * serves each version bit for bit. Refusals name what is wrong; a rank
 * that does not send fails the version naming it. */
struct rank_job {
  tern_rank_publisher* pub;
  tern_client* client;
  tern_shard shard;
  uint64_t version;
  tern_code code;
};

static void* send_rank(void* arg) {
  struct rank_job* j = arg;
  uint64_t part_bytes = 0;
  j->code = tern_rank_publisher_encode(j->pub, j->version, &j->shard, 1, &part_bytes);
  if (j->code == TERN_OK && part_bytes == 0) j->code = TERN_INTERNAL;
  if (j->code == TERN_OK) j->code = tern_rank_publisher_send(j->pub, j->client);
  return NULL;
}

static void test_rank_publishers(const char* dir) {
  enum { kCount = 4096 };
  char served[340];
  struct fleet f;
  if (!fleet_start(dir, "rank", "rank-token", &f)) return;
  tern_agent* root = f.root;
  tern_agent* member = f.member;
  const char* admin = f.admin;
  snprintf(served, sizeof served, "%s/current/model.safetensors", f.member_dir);

  static uint16_t w[kCount];
  for (uint32_t i = 0; i < kCount; ++i) w[i] = tiny_bf16((float)(i % 241u) / 32.0f);
  const uint64_t shape[1] = {kCount};
  tern_tensor layout;
  tern_tensor_init(&layout);
  layout.name = "model.w";
  layout.dtype = "BF16";
  layout.shape = shape;
  layout.ndim = 1;
  tern_client_options co;
  tern_client_options_init(&co);
  co.token = "rank-token";
  co.timeout_ms = 60000;
  tern_client* client = NULL;
  CHECK(tern_client_open(admin, &co, &client) == TERN_OK);

  struct rank_job jobs[2];
  tern_rank_publisher_options ro;
  for (uint32_t r = 0; r < 2; ++r) {
    tern_shard_init(&jobs[r].shard);
    jobs[r].shard.tensor = "model.w";
    jobs[r].shard.first_element = r * (kCount / 2);
    jobs[r].shard.element_count = kCount / 2;
    jobs[r].shard.data = w + r * (kCount / 2);
    jobs[r].shard.bytes = sizeof w / 2;
    jobs[r].client = client;
    jobs[r].pub = NULL;
    tern_rank_publisher_options_init(&ro);
    ro.rank = r;
    ro.world_size = 2;
    ro.layout = &layout;
    ro.layout_count = 1;
    ro.shards = &jobs[r].shard;
    ro.shard_count = 1;
    ro.segment_elements = 512;
    ro.gather_timeout_ms = 30000;
    CHECK(tern_rank_publisher_create(&ro, &jobs[r].pub) == TERN_OK);
  }
  /* Refusals, before anything is sent. */
  tern_rank_publisher* bad = NULL;
  ro.rank = 2;
  CHECK_CODE(tern_rank_publisher_create(&ro, &bad), TERN_INVALID_ARGUMENT, "world size 2");
  ro.rank = 1;
  ro.gather_timeout_ms = 0;
  CHECK_CODE(tern_rank_publisher_create(&ro, &bad), TERN_INVALID_ARGUMENT, "gather_timeout_ms 0");
  ro.gather_timeout_ms = 300;
  tern_shard other = jobs[1].shard;
  other.tensor = "model.nope";
  ro.shards = &other;
  CHECK_CODE(tern_rank_publisher_create(&ro, &bad), TERN_INVALID_ARGUMENT, "model.nope");
  CHECK(bad == NULL);
  if (jobs[0].pub != NULL) {
    CHECK_CODE(tern_rank_publisher_send(jobs[0].pub, client), TERN_INVALID_ARGUMENT, "nothing to send");
    CHECK_CODE(tern_rank_publisher_send(jobs[0].pub, (tern_client*)root), TERN_INVALID_ARGUMENT,
               "not a tern_client");
    CHECK_CODE(tern_rank_publisher_encode(jobs[0].pub, 1, &jobs[1].shard, 1, NULL),
               TERN_INVALID_ARGUMENT, "is not one it owns");
  }

  for (uint64_t v = 1; v <= 2 && jobs[0].pub != NULL && jobs[1].pub != NULL; ++v) {
    if (v == 2)
      for (uint32_t i = 0; i < kCount; i += 89) w[i] ^= 1;  /* both halves change */
    pthread_t threads[2];
    for (int r = 0; r < 2; ++r) {
      jobs[r].version = v;
      CHECK(pthread_create(&threads[r], NULL, send_rank, &jobs[r]) == 0);
    }
    for (int r = 0; r < 2; ++r) pthread_join(threads[r], NULL);
    CHECK(jobs[0].code == TERN_OK && jobs[1].code == TERN_OK);
    CHECK(tern_rank_publisher_version(jobs[0].pub) == v);
    if (member != NULL) {
      CHECK(wait_served(member, v));
      CHECK(file_ends_with(served, w, sizeof w));
    }
  }
  /* Rank 1 never sends version 3: rank 0 hears which rank failed it. */
  ro.rank = 0;
  ro.shards = &jobs[0].shard;
  tern_rank_publisher* alone = NULL;
  CHECK(tern_rank_publisher_create(&ro, &alone) == TERN_OK);
  if (alone != NULL) {
    CHECK(tern_rank_publisher_encode(alone, 3, &jobs[0].shard, 1, NULL) == TERN_OK);
    tern_code got = tern_rank_publisher_send(alone, client);
    CHECK(got != TERN_OK && strstr(tern_last_error(), "no part from rank(s) 1") != NULL);
    CHECK(tern_rank_publisher_version(alone) == 0);
    /* A wrong token is refused by the port. */
    tern_client* wrong = NULL;
    co.token = "wrong";
    CHECK(tern_client_open(admin, &co, &wrong) == TERN_OK);
    CHECK(tern_rank_publisher_encode(alone, 3, &jobs[0].shard, 1, NULL) == TERN_OK);
    CHECK_CODE(tern_rank_publisher_send(alone, wrong), TERN_AUTH, "token");
    tern_client_free(wrong);
    tern_rank_publisher_free(alone);
  }
  /* ABI 1.3, resume: only a new publisher; a version the root is not
   * gathering is refused (MISMATCH, nothing taken), and the publisher then
   * holds the base it resumed from. */
  if (jobs[0].pub != NULL)
    CHECK_CODE(tern_rank_publisher_resume(jobs[0].pub, client, 2, &jobs[0].shard, 1, 3,
                                          &jobs[0].shard, 1, NULL),
               TERN_MISMATCH, "new publisher");
  tern_rank_publisher* again = NULL;
  CHECK(tern_rank_publisher_create(&ro, &again) == TERN_OK);
  if (again != NULL) {
    CHECK_CODE(
        tern_rank_publisher_resume(again, NULL, 2, &jobs[0].shard, 1, 3, &jobs[0].shard, 1, NULL),
        TERN_INVALID_ARGUMENT, "client");
    CHECK_CODE(
        tern_rank_publisher_resume(again, client, 0, &jobs[0].shard, 1, 3, &jobs[0].shard, 1, NULL),
        TERN_INVALID_ARGUMENT, "version 0");
    uint64_t part_bytes = 0;
    CHECK_CODE(tern_rank_publisher_resume(again, client, 2, &jobs[0].shard, 1, 3, &jobs[0].shard, 1,
                                          &part_bytes),
               TERN_MISMATCH, "not being gathered");
    CHECK(part_bytes > 0 && tern_rank_publisher_version(again) == 2);
    tern_rank_publisher_free(again);
  }
  /* ABI 1.8: the base fetched from the root itself. A new publisher
   * rebases to HEAD; a resume from the root of a version nobody gathers is
   * refused and leaves it holding HEAD's bytes; a wrong token takes nothing. */
  tern_rank_publisher* fetched = NULL;
  CHECK(tern_rank_publisher_create(&ro, &fetched) == TERN_OK);
  if (fetched != NULL) {
    uint64_t base_version = 99;
    CHECK_CODE(tern_rank_publisher_rebase(fetched, NULL, &base_version), TERN_INVALID_ARGUMENT,
               "client");
    tern_client* wrong = NULL;
    co.token = "wrong";
    CHECK(tern_client_open(admin, &co, &wrong) == TERN_OK);
    CHECK_CODE(tern_rank_publisher_rebase(fetched, wrong, &base_version), TERN_AUTH, "token");
    tern_client_free(wrong);
    CHECK(base_version == 99 && tern_rank_publisher_version(fetched) == 0);
    CHECK(tern_rank_publisher_rebase(fetched, client, &base_version) == TERN_OK);
    CHECK(base_version == 2 && tern_rank_publisher_version(fetched) == 2);
    CHECK_CODE(tern_rank_publisher_rebase(fetched, client, NULL), TERN_MISMATCH, "new publisher");
    tern_rank_publisher_free(fetched);
  }
  fetched = NULL;
  CHECK(tern_rank_publisher_create(&ro, &fetched) == TERN_OK);
  if (fetched != NULL) {
    uint64_t part_bytes = 0;
    CHECK_CODE(
        tern_rank_publisher_resume_from_root(fetched, client, 3, &jobs[0].shard, 1, &part_bytes),
        TERN_MISMATCH, "not being gathered");
    CHECK(part_bytes > 0 && tern_rank_publisher_version(fetched) == 2);
    tern_rank_publisher_free(fetched);
  }
  tern_status st;
  st.struct_size = sizeof st;
  CHECK(tern_agent_status(root, &st) == TERN_OK);
  CHECK(st.head == 2);
  for (int r = 0; r < 2; ++r) tern_rank_publisher_free(jobs[r].pub);
  tern_client_free(client);
  fleet_free(&f);
}

/* ABI 1.3: epochs in status and events. A supersede renumbers below a
 * wrong HEAD (5000 -> 2) into epoch 1; only the epochs tell the new
 * version 2 from a number the bare versions would order below 5000.
 * The agent emits a version's event after its status names the version,
 * so the event is polled for up to 30 s. */
static int served_event_epoch(tern_agent* agent, int kind, uint64_t version, uint32_t* epoch,
                              uint64_t* digest) {
  int found = 0;
  for (int tries = 0; !found && tries < 600; ++tries) {
    tern_events* batch = NULL;
    if (tries > 0) sleep_ms(50);
    if (tern_agent_wait_events(agent, 0, 1024, 0, &batch) != TERN_OK) return 0;
    for (size_t i = 0; i < tern_events_count(batch); ++i) {
      tern_event e;
      e.struct_size = sizeof e;
      if (tern_events_get(batch, i, &e) != TERN_OK) break;
      if (e.kind == kind && e.version == version) {
        *epoch = e.epoch;
        if (digest != NULL) memcpy(digest, e.digest, sizeof e.digest);
        found = 1;
      }
    }
    tern_events_free(batch);
  }
  return found;
}

static void test_supersede_epochs(const char* dir) {
  char v[3][300];
  write_checkpoints(dir, "e", 11, 3, v);
  const char* v1 = v[0];
  const char* v2 = v[1];
  const char* v3 = v[2];
  struct fleet f;
  if (!fleet_start(dir, "epoch", "right", &f)) return;
  tern_agent* root = f.root;
  tern_agent* member = f.member;
  const char* admin = f.admin;

  CHECK(tern_agent_publish(root, v1, 1) == TERN_OK);
  CHECK(tern_agent_publish(root, v2, 5000) == TERN_OK); /* the wrong number */
  if (member != NULL) CHECK(wait_served(member, 5000));
  tern_status st;
  st.struct_size = sizeof st;
  CHECK(tern_agent_status(root, &st) == TERN_OK);
  CHECK(st.head == 5000 && st.head_epoch == 0 && st.served_epoch == 0);

  tern_client_options co;
  tern_client_options_init(&co);
  co.token = "right";
  co.timeout_ms = 60000;
  co.supersede = 1;
  tern_client* client = NULL;
  CHECK(tern_client_open(admin, &co, &client) == TERN_OK);
  CHECK(client != NULL && tern_client_publish(client, v3, 2) == TERN_OK);

  /* The root: HEAD 2 of epoch 1, served. */
  st.struct_size = sizeof st;
  CHECK(tern_agent_status(root, &st) == TERN_OK);
  CHECK(st.head == 2 && st.head_epoch == 1 && st.served_version == 2 && st.served_epoch == 1);
  st.struct_size = sizeof st;
  CHECK(tern_client_status(client, &st) == TERN_OK);
  CHECK(st.head == 2 && st.head_epoch == 1 && st.served_version == 2 && st.served_epoch == 1);
  /* A caller built against ABI 1.2 (its struct ends where served_epoch
   * begins; head_epoch falls in what was its padding): nothing written
   * past its struct_size. */
  struct {
    tern_status s;
    uint64_t after;
  } old;
  memset(&old, 0xab, sizeof old);
  old.s.struct_size = offsetof(tern_status, served_epoch);
  CHECK(tern_agent_status(root, &old.s) == TERN_OK);
  CHECK(old.s.head == 2 && old.s.served_epoch == 0xababababu);
  memset(&old, 0xab, sizeof old);
  old.s.struct_size = offsetof(tern_status, served_epoch);
  CHECK(tern_client_status(client, &old.s) == TERN_OK);
  CHECK(old.s.head == 2 && old.s.served_epoch == 0xababababu);

  /* The member follows: its served position (1, 2) is above (0, 5000). */
  int moved = 0;
  for (int i = 0; member != NULL && i < 600 && !moved; ++i) {
    st.struct_size = sizeof st;
    CHECK(tern_agent_status(member, &st) == TERN_OK);
    moved = st.served_version == 2 && st.served_epoch == 1;
    if (!moved) sleep_ms(50);
  }
  CHECK(moved && st.head == 2 && st.head_epoch == 1);

  /* Events carry the epoch of their version. */
  uint32_t epoch = 99;
  CHECK(served_event_epoch(root, TERN_EVENT_VERSION_PUBLISHED, 5000, &epoch, NULL) && epoch == 0);
  epoch = 99;
  CHECK(served_event_epoch(root, TERN_EVENT_VERSION_PUBLISHED, 2, &epoch, NULL) && epoch == 1);
  epoch = 99;
  CHECK(member != NULL && served_event_epoch(member, TERN_EVENT_VERSION_SERVED, 5000, &epoch, NULL) &&
        epoch == 0);
  epoch = 99;
  CHECK(member != NULL && served_event_epoch(member, TERN_EVENT_VERSION_SERVED, 2, &epoch, NULL) &&
        epoch == 1);
  /* Over the admin port, too (GET /events' JSON). */
  char* text = malloc(1 << 20);
  if (text != NULL) {
    size_t len = 0;
    CHECK(tern_client_events_json(client, 0, 1024, 0, text, 1 << 20, &len) == TERN_OK);
    CHECK(strstr(text, "\"epoch\":1") != NULL || strstr(text, "\"epoch\": 1") != NULL);
    free(text);
  }
  tern_client_free(client);
  fleet_free(&f);
}

/* What a client subscription's callback saw (ABI 1.6): every event. */
typedef struct {
  pthread_mutex_t mu;
  uint64_t seq[256], version[256];
  int kind[256];
  int count, seq_went_down;
} event_log;
static void record_event(void* user, const tern_event* e) {
  event_log* log = (event_log*)user;
  pthread_mutex_lock(&log->mu);
  if (log->count > 0 && e->seq <= log->seq[log->count - 1]) ++log->seq_went_down;
  if (log->count < 256) {
    log->seq[log->count] = e->seq;
    log->version[log->count] = e->version;
    log->kind[log->count] = e->kind;
    ++log->count;
  }
  pthread_mutex_unlock(&log->mu);
}
/* How many logged events are `kind` of `version`, once at least `want` are
 * (or `ms` passed). */
static int logged(event_log* log, int kind, uint64_t version, int want, long ms) {
  int n = 0;
  for (long waited = 0;; waited += 50) {
    n = 0;
    pthread_mutex_lock(&log->mu);
    for (int i = 0; i < log->count; ++i) n += log->kind[i] == kind && log->version[i] == version;
    pthread_mutex_unlock(&log->mu);
    if (n >= want || waited >= ms) return n;
    sleep_ms(50);
  }
}

/* Publishes on a root after a delay, from another thread. */
typedef struct {
  tern_agent* root;
  const char* checkpoint;
  uint64_t version;
  long delay_ms;
  tern_code code;
} late_publish;
static void* publish_later(void* arg) {
  late_publish* p = (late_publish*)arg;
  sleep_ms(p->delay_ms);
  p->code = tern_agent_publish(p->root, p->checkpoint, p->version);
  return NULL;
}

/* Two batches hold the same events, field by field. */
static void check_same_events(const tern_events* a, const tern_events* b) {
  CHECK(tern_events_count(a) == tern_events_count(b));
  for (size_t i = 0; i < tern_events_count(a) && i < tern_events_count(b); ++i) {
    tern_event x, y;
    x.struct_size = sizeof x;
    y.struct_size = sizeof y;
    CHECK(tern_events_get(a, i, &x) == TERN_OK && tern_events_get(b, i, &y) == TERN_OK);
    CHECK(x.seq == y.seq && x.kind == y.kind && x.version == y.version && x.epoch == y.epoch);
    CHECK(x.all_tensors == y.all_tensors && memcmp(x.digest, y.digest, sizeof x.digest) == 0);
    CHECK(strcmp(x.member, y.member) == 0 && strcmp(x.slot_dir, y.slot_dir) == 0);
    CHECK(x.changed_tensor_count == y.changed_tensor_count);
    for (size_t t = 0; t < x.changed_tensor_count && t < y.changed_tensor_count; ++t)
      CHECK(strcmp(x.changed_tensors[t], y.changed_tensors[t]) == 0);
  }
}

/* 16 lower-case hex digits: an agent process's run (ABI 1.7). */
static int is_run(const char* run) {
  if (strlen(run) != 16) return 0;
  for (const char* p = run; *p != 0; ++p)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
  return 1;
}

/* ABI 1.6: an agent's events over its admin port, polled and by callback,
 * equal to its own; a wait longer than one long poll; a wrong token ends a
 * subscription with TERN_AUTH; a subscription outlives the agent's restart
 * and follows the new process from its first event. ABI 1.7: each polled
 * batch names the agent's run, the same until the agent restarts. */
static void test_client_events(const char* dir) {
  char v[3][300];
  write_checkpoints(dir, "ev", 21, 3, v);
  const char* v1 = v[0];
  const char* v2 = v[1];
  const char* v3 = v[2];
  struct fleet f;
  if (!fleet_start(dir, "events", "right", &f)) return;
  CHECK(tern_agent_publish(f.root, v1, 1) == TERN_OK);
  if (f.member != NULL) CHECK(wait_served(f.member, 1));

  tern_client_options co;
  tern_client_options_init(&co);
  co.token = "right";
  co.timeout_ms = 60000;
  tern_client* client = NULL;
  CHECK(tern_client_open(f.admin, &co, &client) == TERN_OK);
  if (client == NULL) {
    fleet_free(&f);
    return;
  }

  /* Polled: the same events as the agent's own, field by field. */
  tern_events *remote = NULL, *local = NULL;
  CHECK(tern_client_wait_events(client, 0, 1024, 0, &remote) == TERN_OK);
  CHECK(tern_agent_wait_events(f.root, 0, 1024, 0, &local) == TERN_OK);
  CHECK(tern_events_count(remote) >= 3); /* joined, published 1, served 1 */
  check_same_events(remote, local);
  char run[17] = "";
  CHECK(is_run(tern_events_run(remote)));
  snprintf(run, sizeof run, "%s", tern_events_run(remote));
  CHECK(strcmp(tern_events_run(local), "") == 0); /* in process: one handle, one run */
  CHECK(strcmp(tern_events_run(NULL), "") == 0);
  uint64_t newest = 0;
  tern_event e;
  e.struct_size = sizeof e;
  if (tern_events_get(remote, tern_events_count(remote) - 1, &e) == TERN_OK) newest = e.seq;
  tern_events_free(remote);
  tern_events_free(local);
  remote = NULL;
  CHECK_CODE(tern_client_wait_events(client, 0, 0, 0, &remote), TERN_OUT_OF_RANGE, "max_events");
  CHECK_CODE(tern_client_wait_events(client, 0, 8, 600001, &remote), TERN_OUT_OF_RANGE,
             "timeout_ms");
  CHECK_CODE(tern_client_wait_events(client, 0, 8, 0, NULL), TERN_INVALID_ARGUMENT, "out is NULL");
  CHECK_CODE(tern_client_wait_events(NULL, 0, 8, 0, &remote), TERN_INVALID_ARGUMENT,
             "client is NULL");
  CHECK(remote == NULL);

  /* A wait longer than the port's 5 s long poll gets an event published
   * after the first poll ended. */
  late_publish later = {f.root, v2, 2, 5500, TERN_INTERNAL};
  pthread_t publisher;
  CHECK(pthread_create(&publisher, NULL, publish_later, &later) == 0);
  const double t0 = now_s();
  CHECK(tern_client_wait_events(client, newest, 8, 30000, &remote) == TERN_OK);
  const double waited = now_s() - t0;
  pthread_join(publisher, NULL);
  CHECK(later.code == TERN_OK);
  CHECK(tern_events_count(remote) >= 1 && waited >= 5.0 && waited < 25);
  if (tern_events_count(remote) >= 1 && tern_events_get(remote, 0, &e) == TERN_OK)
    CHECK(e.seq == newest + 1 && e.version == 2);
  CHECK(strcmp(tern_events_run(remote), run) == 0);
  tern_events_free(remote);

  /* The callback form: every event the agent holds, then what comes. */
  event_log log;
  memset(&log, 0, sizeof log);
  pthread_mutex_init(&log.mu, NULL);
  tern_subscription* sub = NULL;
  CHECK_CODE(tern_client_subscribe(client, 0, NULL, &log, &sub), TERN_INVALID_ARGUMENT,
             "fn is NULL");
  CHECK_CODE(tern_client_subscribe(NULL, 0, record_event, &log, &sub), TERN_INVALID_ARGUMENT,
             "client is NULL");
  CHECK_CODE(tern_subscription_result(NULL), TERN_INVALID_ARGUMENT, "subscription is NULL");
  CHECK(tern_client_subscribe(client, 0, record_event, &log, &sub) == TERN_OK);
  CHECK(tern_agent_publish(f.root, v3, 3) == TERN_OK);
  CHECK(logged(&log, TERN_EVENT_VERSION_PUBLISHED, 1, 1, 10000) == 1);
  CHECK(logged(&log, TERN_EVENT_VERSION_PUBLISHED, 3, 1, 10000) == 1);
  CHECK(tern_subscription_result(sub) == TERN_OK);

  /* A wrong token ends the thread, with the reason. */
  co.token = "wrong";
  tern_client* bad = NULL;
  CHECK(tern_client_open(f.admin, &co, &bad) == TERN_OK);
  tern_subscription* refused = NULL;
  CHECK(tern_client_subscribe(bad, 0, record_event, &log, &refused) == TERN_OK);
  tern_code ended = TERN_OK;
  for (int i = 0; i < 200 && ended == TERN_OK; ++i) {
    ended = tern_subscription_result(refused);
    if (ended == TERN_OK) sleep_ms(50);
  }
  CHECK_CODE(tern_subscription_result(refused), TERN_AUTH, "token");
  tern_subscription_free(refused);
  tern_client_free(bad);

  /* The agent goes away: the subscription polls on; a new root on the
   * same admin port is followed from its first event (seq goes down). */
  char admin[128];
  snprintf(admin, sizeof admin, "%s", f.admin);
  fleet_free(&f);
  sleep_ms(2500); /* the subscription backs off to 2 s */
  CHECK(tern_subscription_result(sub) == TERN_OK);
  char again_dir[300];
  snprintf(again_dir, sizeof again_dir, "%s/events-again", dir);
  tern_agent_options o;
  base_options(&o, again_dir);
  o.admin_listen = admin;
  o.admin_token = "right";
  tern_agent* again = NULL;
  CHECK(tern_agent_start(&o, &again) == TERN_OK);
  if (again != NULL) {
    /* Its own versions 1..3 (seqs 1..6, published and served), seen
     * whether the subscription's next poll comes before or after the new
     * process numbered past what it had read (the latter, pinned down:
     * agent.AgentEventFollower.*). */
    CHECK(tern_agent_publish(again, v1, 1) == TERN_OK);
    CHECK(tern_agent_publish(again, v2, 2) == TERN_OK);
    CHECK(tern_agent_publish(again, v3, 3) == TERN_OK);
    CHECK(logged(&log, TERN_EVENT_VERSION_PUBLISHED, 1, 2, 15000) == 2);
    CHECK(logged(&log, TERN_EVENT_VERSION_PUBLISHED, 3, 2, 15000) == 2);
    pthread_mutex_lock(&log.mu);
    CHECK(log.seq_went_down == 1);
    pthread_mutex_unlock(&log.mu);
    /* A poller across calls sees the restart in the batch's run, empty
     * batch or not (after_seq 1 was the old process's). */
    remote = NULL;
    CHECK(tern_client_wait_events(client, 1, 8, 0, &remote) == TERN_OK);
    CHECK(is_run(tern_events_run(remote)) && strcmp(tern_events_run(remote), run) != 0);
    tern_events_free(remote);
  }
  const double free_start_s = now_s();
  tern_subscription_free(sub);
  CHECK(now_s() - free_start_s < 7);
  pthread_mutex_destroy(&log.mu);
  tern_client_free(client);
  tern_agent_free(again);
}

int main(void) {
  char dir[] = "/tmp/tern-capi-test-XXXXXX";
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_versions_and_codes();
  char bad_dir[300];
  snprintf(bad_dir, sizeof bad_dir, "%s/unused", dir);
  test_bad_options(bad_dir);
  test_agents(dir);
  test_publish_tensors(dir);
  test_rank_publishers(dir);
  test_supersede_epochs(dir);
  test_client_events(dir);
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (failures != 0) {
    fprintf(stderr, "capi_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("capi_test: all checks passed\n");
  return 0;
}
