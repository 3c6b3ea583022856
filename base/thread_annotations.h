// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html),
// modelled on leveldb's port/thread_annotations.h. They state lock rules that
// a clang build with -Wthread-safety checks (scripts/check_thread_safety.sh,
// run by scripts/test.sh); other compilers see nothing.
//
//   GUARDED_BY(mu)     the member is read and written with mu held
//   PT_GUARDED_BY(mu)  what the pointer points to is, the pointer is not
//   REQUIRES(mu)       the caller holds mu (the "...Locked" functions)
//   EXCLUDES(mu)       the caller does not hold mu (the function takes it)
//   ACQUIRED_AFTER / ACQUIRED_BEFORE  lock order between two mutexes
//
// libstdc++'s std::mutex carries no capability attribute: annotated state is
// guarded by tern::Mutex (base/mutex.h), a std::mutex that says it is one.
#pragma once

#if defined(__clang__)
#define TERN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TERN_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) TERN_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY TERN_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) TERN_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) TERN_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_AFTER(...) TERN_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) TERN_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define REQUIRES(...) TERN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) TERN_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) TERN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) TERN_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) TERN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) TERN_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) TERN_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) TERN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) TERN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) TERN_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) TERN_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS TERN_THREAD_ANNOTATION(no_thread_safety_analysis)
