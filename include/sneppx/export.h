/* sneppx — SNEPPX_API marks what libsneppx exports.
 *
 * The library is compiled with hidden visibility: a function is in its
 * dynamic symbol table only when a header of include/sneppx declares it
 * SNEPPX_API. The source tree lists those names in runtime/exports.txt, and
 * a test fails when the library exports anything else. */
#ifndef SNEPPX_EXPORT_H
#define SNEPPX_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define SNEPPX_API __attribute__((visibility("default")))
#else
#define SNEPPX_API
#endif

#endif
