/* CHECK and EXPECT for the test programs' main(): a failed call prints its name, the
 * result's text and the last error, and returns 1; a failed expectation prints and returns 2. */
#ifndef BCL_TEST_CHECK_H
#define BCL_TEST_CHECK_H
#include <bcl.h>
#include <stdio.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    bclResult_t r_ = (call);                                                          \
    if (r_ != bclSuccess) {                                                           \
      fprintf(stderr, "%s failed: %s: %s\n", #call, bclGetErrorString(r_),          \
              bclGetLastError(NULL));                                                 \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)
#define EXPECT(cond, ...)                                                             \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, __VA_ARGS__);                                                   \
      return 2;                                                                       \
    }                                                                                 \
  } while (0)

#endif
