/* Symbol visibility of the shared library (C and C++).
 *
 * libh5ckpt is built with hidden visibility: only declarations marked H5CKPT_API are exported.
 * C++ gets the standard attribute spelling, which may follow [[nodiscard]] in a class head (the
 * GNU __attribute__ spelling may not); C99 has only the GNU one.
 */
#ifndef H5CKPT_EXPORT_H
#define H5CKPT_EXPORT_H

#if defined(__cplusplus) && (defined(__GNUC__) || defined(__clang__))
#define H5CKPT_API [[gnu::visibility("default")]]
#elif defined(__GNUC__) || defined(__clang__)
#define H5CKPT_API __attribute__((visibility("default")))
#else
#define H5CKPT_API
#endif

#endif /* H5CKPT_EXPORT_H */
