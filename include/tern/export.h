// Symbol visibility for libtern. The library builds with -fvisibility=hidden;
// only declarations marked TERN_EXPORT are part of the shared-object ABI.
#pragma once

#if defined(_WIN32)
#define TERN_EXPORT __declspec(dllexport)
#else
#define TERN_EXPORT [[gnu::visibility("default")]]
#endif
