/* libtern: tern's stable C API, for schedulers and language bindings that
 * embed the transfer agent (docs/embedding.md is the guide).
 *
 * What it offers: start and stop an agent in this process (root or member,
 * the options of `tern-agent`), publish a checkpoint or tensors in memory
 * on an in-process root, publish a trainer rank's shards to a root's admin
 * port (ABI 1.2) and resume a rank's part after its process restarted
 * (ABI 1.3; its base fetched from the root: 1.8),
 * read an agent's status, wait for its events (polled, or delivered to a
 * callback on a thread the library owns); and a client over a running
 * agent's admin port
 * (publish through it, read its status, metrics and publish jobs, and its
 * events as batches or callbacks: ABI 1.6, with the agent's run: 1.7).
 *
 * C99. Link with -ltern (pkg-config tern, or CMake find_package(tern) and
 * the target tern::tern). Only tern_* symbols are exported.
 *
 * ABI rules
 *  - TERN_ABI_VERSION_MAJOR is in the shared object's name (libtern.so.1);
 *    within one major, functions and enum values are only added, never
 *    changed or removed. tern_abi_version() says what the loaded library
 *    implements: a program built against minor M needs a library of the same
 *    major and minor >= M (TERN_ABI_COMPATIBLE below).
 *  - Option and result structs begin with `struct_size`, which the caller
 *    sets to sizeof the struct it was compiled with (the *_init functions do
 *    it). New fields are only appended. The library reads only the first
 *    struct_size bytes of an options struct (fields beyond are defaults),
 *    refuses one larger than it knows unless the unknown tail is all zero
 *    bytes, and writes only the first struct_size bytes of a result struct.
 *  - Handles (tern_agent, tern_client) are opaque; their layout is private.
 *
 * Errors
 *  - Every fallible call returns a tern_code: TERN_OK (0) or an error. The
 *    numbers are tern's error-code registry (include/tern/status.h) and are
 *    stable; codes may be added.
 *  - The message of the last failed call is per thread: tern_last_error()
 *    returns it until the next tern_* call *on the same thread* that returns
 *    a tern_code (a successful one clears it to ""). The pointer is owned by
 *    the library and valid until then.
 *  - No C++ exception crosses this boundary: each call catches everything
 *    and returns TERN_INTERNAL (or TERN_RESOURCE_EXHAUSTED for an allocation
 *    failure) with a message.
 *  - Pointers the caller passes are checked for NULL (TERN_INVALID_ARGUMENT);
 *    a handle of the wrong kind (a tern_client* cast to tern_agent*) is
 *    recognized by its tag (TERN_INVALID_ARGUMENT). A freed handle is
 *    undefined behaviour, as with free().
 *  - Text out: calls that return text take (char* buf, size_t cap, size_t*
 *    len). Once the text is made, *len is set to its length (without the
 *    NUL), whatever cap is. When
 *    cap > len the text and a NUL are written; otherwise nothing is written
 *    and the call returns TERN_RESOURCE_EXHAUSTED: call again with cap >
 *    *len. buf may be NULL when cap is 0 (to ask the size).
 *
 * Thread safety: stated per call. In short, everything but the *_free
 * functions may be called from any thread at any time, on the same handle
 * too; a *_free must be the last call on its handle.
 */
#ifndef TERN_TERN_H_
#define TERN_TERN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TERN_API __attribute__((visibility("default")))
#else
#define TERN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions ---- */

#define TERN_ABI_VERSION_MAJOR 1
#define TERN_ABI_VERSION_MINOR 8
/* (major << 16) | minor, as tern_abi_version() returns it. */
#define TERN_ABI_VERSION ((TERN_ABI_VERSION_MAJOR << 16) | TERN_ABI_VERSION_MINOR)
/* Whether a loaded library's tern_abi_version() serves this header. */
#define TERN_ABI_COMPATIBLE(loaded) \
  (((loaded) >> 16) == TERN_ABI_VERSION_MAJOR && (loaded) >= (uint32_t)TERN_ABI_VERSION)

/* tern's release, e.g. "0.1.0". Static storage. Any thread. */
TERN_API const char* tern_version(void);
/* The ABI the loaded library implements: (major << 16) | minor. Any thread. */
TERN_API uint32_t tern_abi_version(void);

/* ---- Errors ---- */

typedef enum tern_code {
  TERN_OK = 0,
  TERN_INVALID_ARGUMENT = 1,   /* the caller asked for something impossible */
  TERN_CORRUPT = 2,            /* untrusted bytes failed validation */
  TERN_NOT_FOUND = 3,          /* a file, tensor, peer or version is absent */
  TERN_ALREADY_EXISTS = 4,     /* refusing to overwrite */
  TERN_IO = 5,                 /* an operating-system call failed */
  TERN_MISMATCH = 6,           /* well-formed input that does not fit */
  TERN_UNSUPPORTED = 7,        /* valid but not available here */
  TERN_OUT_OF_RANGE = 8,       /* a value outside its documented bounds */
  TERN_RESOURCE_EXHAUSTED = 9, /* a bound was hit (a buffer too small, too) */
  TERN_UNAVAILABLE = 10,       /* a peer, agent or device is not reachable now */
  TERN_TIMEOUT = 11,
  TERN_CANCELLED = 12,
  TERN_INTERNAL = 13, /* a bug or an unexpected failure inside tern */
  TERN_PROTOCOL = 14, /* a peer spoke another protocol or version */
  TERN_AUTH = 15      /* authentication or authorization failed */
} tern_code;

/* Stable lower-case name of a code ("invalid argument"); "unknown" for a
 * number this library does not know. Static storage. Any thread. */
TERN_API const char* tern_code_name(int code);
/* The message of this thread's last failed call ("" after a success or
 * before any call): "<code name>: <file:line>: <what>". Valid until this
 * thread's next tern_* call that returns a tern_code. */
TERN_API const char* tern_last_error(void);

/* ---- An agent in this process ---- */

typedef struct tern_agent tern_agent;

/* A log line from the agent's threads ("relay: ..."), without newline; the
 * text is valid only during the call. Called from any of the agent's
 * threads, possibly at once: it must be thread-safe and return promptly. */
typedef void (*tern_log_fn)(void* user, const char* line);

/* The options of `tern-agent` (docs/agent.md, docs/cli.md). Strings are
 * NUL-terminated and copied by tern_agent_start; NULL means empty / the
 * default. Integers left 0 by tern_agent_options_init mean "the default" only
 * where said. */
typedef struct tern_agent_options {
  size_t struct_size; /* sizeof(tern_agent_options); set by tern_agent_options_init */

  /* Role: root = 1, or a member joining `join` ("HOST:PORT", a standby
   * root after a comma). */
  int root;
  const char* join;
  const char* listen;       /* "HOST:PORT" to listen on; port 0 picks one. Required. */
  const char* admin_listen; /* admin HTTP "HOST:PORT"; NULL: no admin port */

  /* Identity and place. */
  const char* id;     /* NULL: derived from the listen address */
  const char* region; /* NULL: "default" */
  const char* cluster;
  const char* island;
  int may_relay;               /* default 1 */
  int relay_only;              /* member: forward, never serve (docs/agent.md §4) */
  double uplink_bytes_per_s;   /* planning rates until measured; default 1.25e9 */
  double downlink_bytes_per_s; /* default 1.25e9 */

  /* Data and trust. */
  const char* data_dir;        /* DIR; required. DIR/current is the served version */
  const char* signing_key_pem; /* root: Ed25519 key (PEM); NULL: DIR/signing-key.pem or a new one */
  const char* const* trusted_keys_pem; /* member: publisher key(s), PEM; required for members */
  size_t trusted_keys_count;           /* at most 64 */
  const char* join_token;              /* shared secret for joining; NULL: none */
  const char* admin_token;             /* bearer token for POST /publish; NULL: none */
  int admin_insecure;                  /* allow a non-loopback admin port without a token or TLS */
  const char* publish_dir;             /* root: POST /publish reads only below this */
  uint64_t max_version_jump;           /* root: default 1000000; 0: no bound */
  const char* seed_checkpoint;         /* member: a checkpoint of version seed_version it holds */
  uint64_t seed_version;

  /* High availability (root): "etcd://HOST:PORT[,...]/PREFIX"; NULL: DIR/board. */
  const char* board_etcd;
  uint32_t etcd_lease_s; /* default 3 */

  /* Policy (root); defaults as tern-agent's. */
  uint32_t stripes;          /* default 1 */
  uint32_t fanout_max;       /* default 4 */
  uint32_t root_fanout_max;  /* default 8 */
  uint32_t keep_patches;     /* default 16 */
  uint32_t keyframe_every;   /* default 32 */
  uint64_t segment_elements; /* default 1 << 20 */
  uint32_t patch_format;     /* 0: auto (chosen per version); 1 or 2: forced */

  /* Timing; defaults as tern-agent's. */
  uint32_t heartbeat_ms;       /* default 500; members take the root's */
  uint32_t dead_after_ms;      /* default 3000 */
  uint32_t spare_grace_ms;     /* default 2000 */
  int stream_apply;            /* default 1 */
  uint32_t parent_stall_ms;    /* default 10000; 0: never report (root: the
                                  heartbeat rule off); members take the root's */
  uint32_t relay_probation_ms; /* default 60000 */
  uint32_t push_window_bytes;  /* default 2 MiB; at most 64 MiB */
  uint32_t threads;            /* apply/diff threads; 0: the hardware's */

  /* Transport: "tcp+tls" (NULL means it; the three tls_* files are then
   * required), "tcp" (plain: trusted networks only), "ucx" or "verbs" (RDMA,
   * no encryption). tls_server_name: the name the peer's certificate must
   * hold (NULL: the host dialled). */
  const char* transport;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_ca_file;
  const char* tls_server_name;

  /* Where the agent's log lines go; NULL: stderr. */
  tern_log_fn log;
  void* log_user;

  /* ABI 1.1. The admin port speaks HTTPS only with this certificate (PEM:
   * the leaf, then intermediates) and its unencrypted key; both or NULL.
   * A root whose admin_listen is off loopback needs these and admin_token
   * unless admin_insecure (docs/security.md, "The admin port"). */
  const char* admin_tls_cert_pem;
  const char* admin_tls_key_pem;

  /* ABI 1.3. With admin_tls_cert_pem: the CA(s) (PEM) that must have signed
   * a client's certificate (mutual TLS, on top of admin_token); NULL: no
   * client certificate asked for. */
  const char* admin_tls_client_ca_pem;

  /* ABI 1.5. Root: 1 (the default) lets format 2 code packed 4-bit codes
   * (NVFP4, MXFP4, INT4) as nibbles where smaller, which the patch file
   * calls version 3; 0 keeps every patch at version 2, for members whose
   * tern predates version 3 (docs/format/patch.md). 0 or 1. */
  int patch_nibbles;
} tern_agent_options;

/* Sets struct_size and every default above. Any thread. */
TERN_API void tern_agent_options_init(tern_agent_options* options);

/* Opens DIR, listens and (member) starts joining in the background; on
 * success *out is a new handle (free it with tern_agent_free). A standby
 * root (board_etcd) blocks here until it leads. Bad options:
 * TERN_INVALID_ARGUMENT naming the field. Any thread. */
TERN_API tern_code tern_agent_start(const tern_agent_options* options, tern_agent** out);

/* Root: diffs the checkpoint (a .safetensors file or a directory) against
 * HEAD, signs it and starts feeding it as `version` (> HEAD). Returns when
 * the version is durable on the board, before members have it. Blocks for
 * the diff (seconds for large models). Any thread; one publish at a time
 * per root (a second waits). */
TERN_API tern_code tern_agent_publish(tern_agent* agent, const char* checkpoint_path,
                                      uint64_t version);

/* One tensor of a serve view in the caller's memory (ABI 1.1): the exact
 * bytes an engine serves, contiguous and row-major, in host memory. A
 * PyTorch CPU tensor's data_ptr() (after .contiguous()) or a NumPy array's
 * ctypes.data (C order) is passed as is: nothing is copied before the diff
 * reads it. Strings and `shape` are read during the call only. */
typedef struct tern_tensor {
  size_t struct_size;    /* sizeof(tern_tensor); set by tern_tensor_init */
  const char* name;      /* NUL-terminated, 1..4096 bytes */
  const char* dtype;     /* the safetensors spelling: "BF16", "F32", "F8_E4M3", "U8", ... */
  const uint64_t* shape; /* ndim sizes; may be NULL when ndim is 0 (a scalar) */
  uint32_t ndim;         /* at most 8 */
  const void* data;      /* `bytes` bytes; may be NULL only when bytes is 0 */
  uint64_t bytes;        /* must be the dtype's size of the shape */
} tern_tensor;

/* Sets struct_size, every other field 0 / NULL. Any thread. */
TERN_API void tern_tensor_init(tern_tensor* tensor);

/* Root (ABI 1.1): publishes `count` tensors (any order; every tensor of the
 * view, each once) as `version` (> HEAD), without a checkpoint file: the
 * root diffs them against the view it serves, signs and feeds the version
 * as tern_agent_publish does, and serves it itself. The version carries no
 * model files (config.json): members keep theirs. `tensors` is an array
 * whose elements all have the struct_size of tensors[0] (the stride); at
 * most 1000000. The bytes are read during the call and not kept: the caller
 * may reuse them once it returns. Refused before anything is published,
 * with a message naming the tensor: TERN_INVALID_ARGUMENT for a bad tensor
 * (NULL name or data, an unknown dtype, `bytes` not the dtype's size of
 * the shape, a name twice) or a version not newer than HEAD;
 * TERN_MISMATCH once a version is served, for a tensor the served layout
 * lacks, one it has that is missing, or another dtype or shape than it
 * serves. Blocks for the diff. Any thread; one publish at a time per root
 * (a second waits). */
TERN_API tern_code tern_agent_publish_tensors(tern_agent* agent, uint64_t version,
                                              const tern_tensor* tensors, size_t count);

/* ABI 1.4: D(view), the digest of a whole serve view in the caller's memory
 * (docs/format/patch.md "Digest"), into out[4] (lanes as in tern_event's
 * digest). An engine that applied a version to its own tensors in place
 * compares it with the version's digest, which the root's signed manifest
 * binds: equal means its tensors are the version, bit for bit. `tensors`:
 * every tensor of the view, each once, any order, as for
 * tern_agent_publish_tensors (the same stride rule and checks:
 * TERN_INVALID_ARGUMENT naming the tensor, "view_digest: ..."). Reads the
 * bytes in place on up to 8 threads; blocks for the hash (about a memcpy of
 * the view per thread). Needs no agent. Any thread. */
TERN_API tern_code tern_view_digest(const tern_tensor* tensors, size_t count, uint64_t out[4]);

/* The figures a scheduler polls. Written up to out->struct_size. */
typedef struct tern_status {
  size_t struct_size; /* the caller sets sizeof(tern_status) */
  int root;
  int relay_only;
  int joined;              /* member: joined the root (root: 1) */
  uint64_t head;           /* root: HEAD; member: the newest version it knows */
  uint64_t served_version; /* the version DIR/current serves (0: none) */
  uint64_t held_version;   /* relay-only: newest held completely; else served_version */
  uint32_t member_count;   /* root: members it knows; member: 0 */
  uint32_t version_count;  /* root: versions it keeps; member: 0 */
  /* Root: serving members (relay-only ones serve nothing and are not
   * counted) whose served version is HEAD, as their last heartbeats said. */
  uint32_t members_at_head;
  /* ABI 1.3. Board epochs (docs/agent/board.md §4a; 0 until the first
   * supersede): HEAD's (member: of the newest HEAD it knows) and the served
   * version's (relay-only: the held version's). Versions are ordered as
   * positions (epoch, version), epoch first: a supersede opens a higher
   * epoch with a *lower* number, so compare (served_epoch, served_version)
   * with (head_epoch, head), never the bare numbers. served_epoch <
   * head_epoch: DIR/current serves a withdrawn version until the agent
   * moves to HEAD. A caller built against ABI 1.2 passes the shorter
   * struct and gets neither. */
  uint32_t head_epoch;
  uint32_t served_epoch;
} tern_status;

/* Any thread. TERN_UNAVAILABLE once the agent is stopped. */
TERN_API tern_code tern_agent_status(tern_agent* agent, tern_status* out);
/* The JSON text GET /status serves (docs/agent/operations.md). Text out. */
TERN_API tern_code tern_agent_status_json(tern_agent* agent, char* buf, size_t cap, size_t* len);
/* Root: the public key (PEM) members must trust. Text out. */
TERN_API tern_code tern_agent_public_key_pem(tern_agent* agent, char* buf, size_t cap, size_t* len);
/* The bound addresses ("HOST:PORT"; port 0 resolved). Text out;
 * the admin address is "" when there is no admin port. */
TERN_API tern_code tern_agent_listen_address(tern_agent* agent, char* buf, size_t cap, size_t* len);
TERN_API tern_code tern_agent_admin_address(tern_agent* agent, char* buf, size_t cap, size_t* len);

/* Root, for schedulers (ABI 1.1; docs/agent/operations.md "Draining and
 * removing members"). drain: `member_id` relays for nobody from now on (its
 * children move to other parents at once) and stays a leaf while joined; it
 * keeps serving. Drain a member before taking it away and its departure
 * moves nobody. remove: drops it now, as if it had gone silent, without
 * waiting for dead_after_ms, and refuses its joins for rejoin_after_ms (at
 * most 86400000; 0: at once). TERN_NOT_FOUND for a member that is not
 * joined (remove still starts the refusal). set_retention: keep_patches and
 * keyframe_every (both >= 1) for later publications and retention passes.
 * Any thread. */
TERN_API tern_code tern_agent_drain_member(tern_agent* agent, const char* member_id);
TERN_API tern_code tern_agent_remove_member(tern_agent* agent, const char* member_id,
                                            uint32_t rejoin_after_ms);
TERN_API tern_code tern_agent_set_retention(tern_agent* agent, uint32_t keep_patches,
                                            uint32_t keyframe_every);

/* Leaves (a member tells the root), closes every connection and joins the
 * agent's threads; waits for calls in flight on this handle. Idempotent.
 * Later calls on the handle but tern_agent_free return TERN_UNAVAILABLE.
 * Any thread, but not from the log callback. */
TERN_API tern_code tern_agent_stop(tern_agent* agent);
/* Stops (as above) and frees. NULL is a no-op. Must be the last call on the
 * handle, with no other call in flight. */
TERN_API void tern_agent_free(tern_agent* agent);

/* ---- Events of an agent in this process ---- */

/* What happened (docs/agent/operations.md "Events"). */
typedef enum tern_event_kind {
  TERN_EVENT_VERSION_PUBLISHED = 1, /* root: `version` is on the board */
  TERN_EVENT_VERSION_SERVED = 2,    /* DIR/current now serves `version` */
  TERN_EVENT_MEMBER_JOINED = 3,     /* root: `member` joined (or came back) */
  TERN_EVENT_MEMBER_LEFT = 4,       /* root: `member` said goodbye */
  TERN_EVENT_MEMBER_FAILED = 5,     /* root: `member` went silent past dead_after_ms */
  TERN_EVENT_MEMBER_DEMOTED = 6,    /* root: `member` relays no more until its probation ends */
  TERN_EVENT_MEMBER_DRAINED = 7,    /* root: an operator drained `member` (ABI 1.1) */
  TERN_EVENT_MEMBER_REMOVED = 8     /* root: an operator removed `member` (ABI 1.1) */
} tern_event_kind;

/* "version_served", ...; "unknown" for a number this library does not know.
 * Static storage. Any thread. */
TERN_API const char* tern_event_kind_name(int kind);

/* One event. Its strings point into the batch (or, in a callback, live
 * for the call) that produced it. */
typedef struct tern_event {
  size_t struct_size;   /* the caller sets sizeof(tern_event) */
  uint64_t seq;         /* consecutive from 1 per agent run; a jump means events were dropped */
  double at_s;          /* the agent's clock */
  int kind;             /* tern_event_kind; 0 from tern_client_*: a kind a newer agent sent */
  int all_tensors;      /* served/published: the whole view is new (first version, keyframe) */
  uint64_t version;     /* published / served; 0 for membership events */
  uint64_t digest[4];   /* D(version), lanes as in patches; zero for membership events */
  const char* member;   /* membership events: the member's id; others: this agent's */
  const char* slot_dir; /* served: the slot DIR/current pointed at (DIR/views/a or b); else "" */
  /* Served/published without all_tensors: the tensors whose bytes changed, sorted. */
  const char* const* changed_tensors;
  size_t changed_tensor_count;
  /* ABI 1.3. The board epoch of `version` (docs/agent/board.md §4a; 0
   * until the first supersede, and for membership events): from one
   * version event to the next, (epoch, version) only goes up, the version
   * number alone need not (a supersede renumbers below a withdrawn HEAD). */
  uint32_t epoch;
} tern_event;

/* A batch of events, from tern_agent_wait_events; free it with
 * tern_events_free. Read-only: any thread may read one batch at once. */
typedef struct tern_events tern_events;

/* The agent's events with seq > after_seq (0: every event it holds; it
 * keeps its last 1024; an after_seq beyond its newest, as from before the
 * agent restarted, counts as 0), oldest first, at most max_events
 * (1..1024). When
 * there are none yet, waits up to timeout_ms (at most 600000) for the first,
 * and returns TERN_OK with an empty batch if none came. *out is a new batch
 * either way. Any thread (at most 64 waits at once per agent:
 * TERN_RESOURCE_EXHAUSTED); tern_agent_stop ends a wait within about 100 ms
 * (TERN_UNAVAILABLE). */
TERN_API tern_code tern_agent_wait_events(tern_agent* agent, uint64_t after_seq,
                                          uint32_t max_events, uint32_t timeout_ms,
                                          tern_events** out);
/* The number of events in a batch (0 for NULL). */
TERN_API size_t tern_events_count(const tern_events* events);
/* Event `index` (< count; else TERN_OUT_OF_RANGE), written up to
 * out->struct_size; its strings stay valid until tern_events_free. */
TERN_API tern_code tern_events_get(const tern_events* events, size_t index, tern_event* out);
/* NULL is a no-op. */
TERN_API void tern_events_free(tern_events* events);

/* The callback form: a thread the library owns waits for the agent's events
 * and calls `fn` with each, in order, one at a time (the event and its
 * strings live for the call). It starts after `after_seq` (0: every event
 * the agent holds). The thread ends when the subscription is freed or the
 * agent stops. */
typedef void (*tern_event_fn)(void* user, const tern_event* event);
typedef struct tern_subscription tern_subscription;

/* Any thread. `fn` runs on the subscription's thread: it may call tern_*
 * functions (tern_agent_stop too; not tern_subscription_free of its own
 * subscription, nor tern_agent_free) and should return promptly. */
TERN_API tern_code tern_agent_subscribe(tern_agent* agent, uint64_t after_seq, tern_event_fn fn,
                                        void* user, tern_subscription** out);
/* Stops the thread (waiting for a callback in flight) and frees. NULL is a
 * no-op. Free every subscription of an agent before tern_agent_free of
 * that agent (tern_agent_stop may come first). Not from the callback. */
TERN_API void tern_subscription_free(tern_subscription* subscription);
/* ABI 1.6. TERN_OK while the subscription's thread runs; once it ended,
 * the code that ended it, with its reason as tern_last_error()
 * (TERN_UNAVAILABLE: the agent stopped; from tern_client_subscribe, an
 * error it does not retry, e.g. TERN_AUTH). TERN_INVALID_ARGUMENT for a
 * NULL or foreign handle. Any thread. */
TERN_API tern_code tern_subscription_result(const tern_subscription* subscription);

/* ---- A client of a running agent's admin port ---- */

typedef struct tern_client tern_client;

typedef struct tern_client_options {
  size_t struct_size;  /* sizeof(tern_client_options); set by tern_client_options_init */
  const char* token;   /* bearer token for publishing (the agent's admin token) */
  uint32_t timeout_ms; /* per request; a publish waits this long in all. Default 600000 */
  int force;           /* publish a version far beyond HEAD (max_version_jump) */
  /* ABI 1.1. For an "https://HOST:PORT" address: the CA(s) (PEM) the
   * agent's admin certificate must chain to; NULL: the system's trust store. */
  const char* ca_pem;
  /* ABI 1.3. For an agent whose admin port requires a client certificate
   * (admin_tls_client_ca_pem): ours and its unencrypted key (PEM), both or
   * NULL. */
  const char* cert_pem;
  const char* key_pem;
  /* ABI 1.3. 1: a publish is a supersede, the recovery from a wrong version
   * number: the version, below HEAD and not a number the board holds, opens
   * the next board epoch (docs/agent/operations.md). 0 or 1. */
  int supersede;
} tern_client_options;

TERN_API void tern_client_options_init(tern_client_options* options);

/* A handle over an admin address "HOST:PORT", "http://HOST:PORT" or
 * "https://HOST:PORT" (ABI 1.1; TLS, the certificate verified against
 * ca_pem and its name against HOST) (checked for form, not
 * reached: nothing is connected until a call). Any thread. */
TERN_API tern_code tern_client_open(const char* admin_address, const tern_client_options* options,
                                    tern_client** out);
/* POST /publish to a root: it reads the checkpoint (a path *the root* can
 * read) and publishes `version`; returns when the version is on the board
 * or the timeout passed (TERN_TIMEOUT: the root is still publishing).
 * Errors carry the root's code and reason (TERN_AUTH: bad token). Any
 * thread. */
TERN_API tern_code tern_client_publish(tern_client* client, const char* checkpoint_path,
                                       uint64_t version);
/* GET /status parsed into the small struct. Any thread. */
TERN_API tern_code tern_client_status(tern_client* client, tern_status* out);
/* GET /status, GET /metrics (Prometheus text), GET /publish (a root's
 * recent publish jobs, JSON). Text out. Any thread. */
TERN_API tern_code tern_client_status_json(tern_client* client, char* buf, size_t cap, size_t* len);
TERN_API tern_code tern_client_metrics(tern_client* client, char* buf, size_t cap, size_t* len);
TERN_API tern_code tern_client_publish_jobs_json(tern_client* client, char* buf, size_t cap,
                                                 size_t* len);
/* GET /events: the agent's events after `after_seq` as JSON text
 * ({"events": [...], "gap", "restarted", "next", "last_seq"}:
 * docs/agent/operations.md "Events"), waiting up to timeout_ms (at most
 * 5000: the port's bound; resume with after_seq = "next") for the first;
 * max_events 1..1024. Needs the token when the agent has one. Text out. Any
 * thread. */
TERN_API tern_code tern_client_events_json(tern_client* client, uint64_t after_seq,
                                           uint32_t max_events, uint32_t timeout_ms, char* buf,
                                           size_t cap, size_t* len);
/* ABI 1.6. GET /events as a batch (tern_events_count, _get, _free), the
 * rules of tern_agent_wait_events: the events after `after_seq` (one beyond
 * the agent's newest, as from before it restarted, counts as 0), oldest
 * first, at most max_events (1..1024), waiting up to timeout_ms (at most
 * 600000, as long polls of at most 5 s) for the first; TERN_OK with an empty
 * batch if none came. A reply that is not GET /events' JSON is
 * TERN_PROTOCOL naming the field (every count and length bounded). An
 * agent that restarts during the call is read from its first event; across
 * calls the agent's rule above is all there is (one that restarted and
 * numbered past after_seq answers only its newer events: compare each
 * batch's tern_events_run with the last one's, or follow restarts with
 * tern_client_subscribe). Each request waits at most 5 s beyond its
 * long poll for an answer (less with a shorter client timeout_ms; connect
 * and read each), then TERN_TIMEOUT or TERN_UNAVAILABLE. Needs the token
 * when the agent has one. *out is a new batch on TERN_OK. Any thread. */
TERN_API tern_code tern_client_wait_events(tern_client* client, uint64_t after_seq,
                                           uint32_t max_events, uint32_t timeout_ms,
                                           tern_events** out);
/* ABI 1.7. The run of the agent process that answered a batch of
 * tern_client_wait_events: an opaque text of at most 64 bytes (16 hex
 * digits from this version's agents) drawn when that process started, the
 * same in every answer of one process, empty batches included ("" from an
 * agent older than the field); compare it, do not parse it. A run other than the last batch's means
 * the agent restarted: its seqs began again at 1, so ask again with
 * after_seq 0 or events of the new process are skipped. "" for a batch of
 * tern_agent_wait_events (one handle is one run), and for NULL or a
 * foreign pointer. Valid until tern_events_free. */
TERN_API const char* tern_events_run(const tern_events* events);
/* ABI 1.6. The callback form over the admin port, as tern_agent_subscribe:
 * a thread the library owns long-polls GET /events (1 s a poll) and calls
 * `fn` with each event, in order, one at a time. An agent that cannot be
 * reached (TERN_UNAVAILABLE, TERN_TIMEOUT: a restart, a cut, its listeners
 * busy) is polled again, backing off from 0.1 s to 2 s; one that came back
 * as a new process is followed from its first event (its seqs begin at 1
 * again, so seq goes down once). Any other error ends the thread
 * (tern_subscription_result says which). Each poll's request waits at most
 * 5 s beyond its long poll for the connect and again for the answer (less
 * with a shorter client timeout_ms), and tern_subscription_free waits for
 * the poll in flight: about 11 s at worst, against an agent that does not
 * answer. Free every subscription of a client before tern_client_free. Any
 * thread. */
TERN_API tern_code tern_client_subscribe(tern_client* client, uint64_t after_seq, tern_event_fn fn,
                                         void* user, tern_subscription** out);
/* The three root calls above through its admin port (ABI 1.1): POST
 * /members/drain, /members/remove, /retention; they need the token when the
 * root has one (TERN_AUTH). Any thread. */
TERN_API tern_code tern_client_drain_member(tern_client* client, const char* member_id);
TERN_API tern_code tern_client_remove_member(tern_client* client, const char* member_id,
                                             uint32_t rejoin_after_ms);
TERN_API tern_code tern_client_set_retention(tern_client* client, uint32_t keep_patches,
                                             uint32_t keyframe_every);
/* NULL is a no-op. Must be the last call on the handle. */
TERN_API void tern_client_free(tern_client* client);

/* ---- Trainer ranks in other processes (ABI 1.2) ----
 *
 * Each trainer rank publishes the tensors, or row shards of tensors, it
 * owns: it diffs them against its own previous view of them, encodes the
 * changed segments and sends that part to the root's admin port (POST
 * /publish/rank-part), which commits one version once every rank's part is
 * there (docs/agent/board.md §4b; the bytes: docs/format/agent.md §11).
 * Full weights never travel. */

typedef struct tern_rank_publisher tern_rank_publisher;

/* One element range of a tensor (a row shard of a row-major tensor: rows
 * [r0, r1) are elements [r0 * row, r1 * row)). For tern_rank_publisher_encode
 * `data` holds the range's current serve-view bytes (`bytes` of them,
 * contiguous, host memory: a CPU torch tensor's data_ptr() or a C-order
 * NumPy array's ctypes.data, read during the call only, not copied first);
 * tern_rank_publisher_create ignores data and bytes. */
typedef struct tern_shard {
  size_t struct_size;     /* sizeof(tern_shard); set by tern_shard_init */
  const char* tensor;     /* a name of the layout */
  uint64_t first_element;
  uint64_t element_count; /* >= 1 */
  const void* data;
  uint64_t bytes;
} tern_shard;

TERN_API void tern_shard_init(tern_shard* shard);

typedef struct tern_rank_publisher_options {
  size_t struct_size; /* sizeof(tern_rank_publisher_options); set by _init */
  uint32_t rank;       /* < world_size */
  uint32_t world_size; /* 1..65536, the same on every rank */
  /* Every tensor of the served view (names, dtypes, shapes; data and bytes
   * are ignored), the same on every rank, any order; an array of
   * tern_tensor with the stride tensors[0].struct_size. */
  const tern_tensor* layout;
  size_t layout_count;
  /* The ranges this rank owns (stride shards[0].struct_size): disjoint;
   * all ranks' together cover every element exactly once. */
  const tern_shard* shards;
  size_t shard_count;
  uint64_t segment_elements; /* 1..2^24-1; default 1048576 */
  /* How long the root waits for the other ranks' parts once the first
   * part of a version came (1..600000; default 60000). */
  uint32_t gather_timeout_ms;
} tern_rank_publisher_options;

TERN_API void tern_rank_publisher_options_init(tern_rank_publisher_options* options);

/* A publisher whose previous view is all zeros at version 0 (the board
 * must be empty, or this rank's shards must be zero in HEAD; a rank that
 * restarts on a non-empty board is refused by the root, TERN_MISMATCH,
 * unless it resumes from HEAD's bytes: tern_rank_publisher_resume).
 * TERN_INVALID_ARGUMENT naming the tensor for a bad layout or range. The
 * strings and arrays are read during the call only. Any thread. */
TERN_API tern_code tern_rank_publisher_create(const tern_rank_publisher_options* options,
                                              tern_rank_publisher** out);

/* Encodes `version` (above the last committed one) from the shards'
 * current bytes (`count` shards, the ranges create named, any order) and
 * keeps the part until tern_rank_publisher_send; an earlier part not sent
 * is dropped. *part_bytes (may be NULL): the part's size on the wire.
 * Calls on one publisher are serialized (a second waits); any thread. */
TERN_API tern_code tern_rank_publisher_encode(tern_rank_publisher* publisher, uint64_t version,
                                              const tern_shard* shards, size_t count,
                                              uint64_t* part_bytes);

/* Sends the encoded part to the root behind `client` (its address, token,
 * CA and timeout_ms) and waits for the version's one outcome, however long
 * the root gathers and publishes (polling its GET /publish/rank-part; the
 * client's timeout_ms bounds the wait: TERN_TIMEOUT). TERN_OK: the version
 * is on the board, and the shards' bytes become this rank's previous view.
 * TERN_TIMEOUT: the outcome is not known yet; the part stays encoded and
 * sending it again asks the root (a part the root committed is answered
 * TERN_OK, not published twice). Any other error (the root's code and
 * reason, naming the ranks that did not send): the part is abandoned and
 * the previous view stays; encode the next attempt again. TERN_INTERNAL
 * after the root committed (the version is on the board): this publisher
 * could not apply its own part to its previous view (no memory, a bug)
 * and refuses every later call; make a new one and resume it from HEAD.
 * TERN_INVALID_ARGUMENT when nothing is encoded.
 * Serialized with encode on one publisher; any thread. */
TERN_API tern_code tern_rank_publisher_send(tern_rank_publisher* publisher, tern_client* client);

/* ABI 1.3. A rank whose process restarted while the root was gathering
 * `version` (the publisher that encoded its part, and its previous view,
 * died with it) resumes that version on a new publisher, one that has
 * committed nothing (else TERN_MISMATCH). `base` holds this rank's shards
 * (the ranges create named, any order; `data`/`bytes` as for encode) as
 * of base_version, the board's HEAD, read from a view that serves it (a
 * member's slot, DIR/current); they become the previous view (hashed once
 * directly, one pass). On an empty board pass base_version 0,
 * base NULL and base_count 0: the zero view stays. Then `version` is
 * encoded from `shards` as tern_rank_publisher_encode does (*part_bytes
 * may be NULL) and sent as a resume, waiting for the version's one outcome
 * as tern_rank_publisher_send does. The root takes a resumed part only into
 * its open gathering of `version`, at the base version of the other ranks'
 * parts; the same bytes as a part sent before the restart are answered with
 * that part's outcome. TERN_MISMATCH: the root refused it, nothing taken
 * and its gathering untouched; the message says why and what to do (the
 * version is not being gathered: if HEAD is `version` it committed, else
 * publish it anew on every rank; this rank's part is there already: wait
 * for the version's outcome; another base than the other ranks': resume
 * from that version's bytes; a base that is not that version's bytes of
 * this rank's shards, checked against the root's own view of that version
 * when it serves it, else against the terms of the parts it committed it
 * from). After a refusal the previous view stays
 * base's, at base_version: when that is HEAD, this publisher goes on with
 * encode and send as usual. TERN_TIMEOUT: as for send (the part stays; send asks
 * again). TERN_INVALID_ARGUMENT: shards or base not the owned ranges, or
 * base_version 0 with a base. Serialized with the publisher's other
 * calls; any thread. */
TERN_API tern_code tern_rank_publisher_resume(tern_rank_publisher* publisher, tern_client* client,
                                              uint64_t base_version, const tern_shard* base,
                                              size_t base_count, uint64_t version,
                                              const tern_shard* shards, size_t count,
                                              uint64_t* part_bytes);

/* ABI 1.8. A new publisher (one that has committed nothing; else
 * TERN_MISMATCH) rebuilds its previous view from the root behind `client`:
 * this rank's shards of the root's HEAD, fetched over its admin port
 * (GET /view/rows with the client's token, one request per piece of at
 * most 8 MiB, each copied into the previous view as it arrives: the
 * shards are never held twice). For a rank whose process restarted
 * between versions; afterwards encode and send the next version as
 * usual. *base_version (may be NULL): the version fetched, 0 on an empty
 * board (the zero view stays). A version the root publishes while the
 * pieces are fetched starts the fetch again at the new HEAD (TERN_MISMATCH
 * after four tries). A root busy publishing, or too busy to answer (many
 * ranks restarting at once), is asked again until the client's timeout_ms
 * (TERN_TIMEOUT), as is a root applying HEAD to its own view;
 * TERN_UNAVAILABLE when it serves another version than HEAD until then (it
 * took the board over and has published nothing since: resume from a
 * member's slot with tern_rank_publisher_resume; with the default timeout
 * that is 10 minutes of asking). TERN_AUTH for a missing or wrong token;
 * TERN_INVALID_ARGUMENT when the root refuses a piece (its layout differs
 * from the publisher's; the message says how) or `client` is not a root's
 * port. Any failure leaves the publisher as it was (version 0, the zero
 * view). The root checks the bytes against its digest when the next part
 * arrives, as it checks every base. Serialized with the publisher's other
 * calls; any thread. */
TERN_API tern_code tern_rank_publisher_rebase(tern_rank_publisher* publisher, tern_client* client,
                                              uint64_t* base_version);

/* ABI 1.8. tern_rank_publisher_resume with the base fetched from the root
 * as tern_rank_publisher_rebase fetches it (no base to read from a
 * member's slot): for a rank whose process restarted while the root was
 * gathering `version`. Outcomes as tern_rank_publisher_resume's; when the
 * root refuses the part (TERN_MISMATCH: the version is not being gathered,
 * or this rank's part is there already) the publisher holds HEAD's bytes
 * and goes on with encode and send. Serialized with the publisher's other
 * calls; any thread. */
TERN_API tern_code tern_rank_publisher_resume_from_root(tern_rank_publisher* publisher,
                                                        tern_client* client, uint64_t version,
                                                        const tern_shard* shards, size_t count,
                                                        uint64_t* part_bytes);

/* The version of this rank's previous view (0 before its first commit).
 * Any thread. */
TERN_API uint64_t tern_rank_publisher_version(tern_rank_publisher* publisher);

/* NULL is a no-op. Must be the last call on the handle. */
TERN_API void tern_rank_publisher_free(tern_rank_publisher* publisher);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_TERN_H_ */
