/* Comparisons of two arrays in one pass: what diff.py computes with numpy in several.
 *
 * Built by the package build (hatch_build.py) into the extension module
 * onnx_sbs_nb.native._sbs_native; without it (no C compiler, no Python.h) the numpy path
 * runs.  An extension, not a library loaded with ctypes: a call costs 0.2 us where
 * ctypes took 3 (reading each array's address through __array_interface__ was most of
 * it), and a run makes one or two calls per pair.
 * Every result must equal the numpy path's bit for bit (tests/compare/test_native.py): the
 * same IEEE operations in the same precision, so no -ffast-math and no contraction
 * of a * b + c into a fused multiply-add (-ffp-contract=off).
 * Only the stable ABI of Python 3.11 is used (the build defines Py_LIMITED_API there): one
 * abi3 module serves every CPython from 3.11 on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first: it may set feature macros the system headers read */

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SBS_NATIVE_VERSION 4

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one build for any x86-64, with an AVX2 body picked at load time where the CPU has it */
#define SBS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SBS_CLONES
#endif

/* out: [max |e - g|, max |e - g| / (|e| + atol), positions where one side is non-finite
 * and the other is not the same non-finite value, count |e - g| > 0.1, count > 0.01,
 * count |e - g| > atol + rtol |e|, sum e^2, sum g^2, sum e g, sum (e - g)^2, max ulp
 * distance], over the pairs where both sides are finite (the others contribute nothing
 * but their count).  The sums are accumulated in double (the measures of measures.py);
 * the ulp distance is the distance of the two values' bits as ordered integers (-0.0 and
 * 0.0 alike).  Integers up to 2^31 per lane, so the vector loop runs in chunks.
 * keys (when not NULL, with MEAS): the keys of SBS_KEYS, |e - g| as bits, written in the
 * same pass, so that the quantiles need no second pass over e and g.
 * The double sums are kept in SPLIT vectors of 4 lanes each: a vector of eight doubles
 * is wider than AVX2's registers, and GCC spilled it through the stack (three times the
 * instructions); each lane still sums the same elements in the same order, and the lanes
 * are added up in the same order, so the sums are unchanged.  The 4 doubles are built
 * element by element (SBS_D4): GCC 12 turns __builtin_convertvector of 4 floats into two
 * conversions of 2 and a shuffle, the element-wise form into one vcvtps2pd. */
#define SBS_D4(v, o) {(double)(v)[(o)], (double)(v)[(o) + 1], (double)(v)[(o) + 2], (double)(v)[(o) + 3]}
#define SBS_COMPARE(NAME, T, IT, UT, LANES, MAXV, ABSMASK, SIGNSHIFT, INFBITS, SPLIT, MEAS)  \
    typedef T NAME##_v __attribute__((vector_size(sizeof(T) * LANES)));                    \
    typedef IT NAME##_m __attribute__((vector_size(sizeof(T) * LANES)));                   \
    typedef UT NAME##_u __attribute__((vector_size(sizeof(T) * LANES)));                   \
    typedef double NAME##_d __attribute__((vector_size(sizeof(double) * 4)));              \
    _Static_assert(LANES == 4 * SPLIT, "the double sums are kept in vectors of 4");        \
    SBS_CLONES static int NAME(const T *e, const T *g, int64_t n, double atol, double rtol, \
                               double *out, UT *keys) {                                    \
        enum { H = 4 };                                                                    \
        const T a_tol = (T)atol, r_tol = (T)rtol, r_add = atol > 0 ? a_tol : (T)1e-12;     \
        const T t01 = (T)0.1, t001 = (T)0.01;                                              \
        const NAME##_v zero = {0};                                                         \
        const NAME##_v va = zero + a_tol, vr = zero + r_tol, vadd = zero + r_add;          \
        const NAME##_v big = zero + MAXV, v01 = zero + t01, v001 = zero + t001;            \
        const NAME##_m vinf = (NAME##_m){0} + (IT)INFBITS;                                 \
        T m = 0, rel = 0;                                                                  \
        double see = 0, sgg = 0, seg = 0, sdd = 0;                                         \
        UT ulp = 0;                                                                        \
        int64_t c_nan = 0, c01 = 0, c001 = 0, c_fail = 0, i = 0;                           \
        while (i + LANES <= n) {                                                           \
            int64_t stop = n - (n - i) % LANES;                                            \
            if (stop - i > ((int64_t)1 << 28)) stop = i + ((int64_t)1 << 28);              \
            NAME##_v vm = zero, vrel = zero;                                               \
            NAME##_m k_nan = {0}, k01 = {0}, k001 = {0}, k_fail = {0};                     \
            NAME##_d d_ee[SPLIT] = {{0}}, d_gg[SPLIT] = {{0}}, d_eg[SPLIT] = {{0}},        \
                     d_dd[SPLIT] = {{0}};                                                  \
            NAME##_u vulp = {0};                                                           \
            for (; i < stop; i += LANES) {                                                 \
                NAME##_v a, b;                                                             \
                memcpy(&a, e + i, sizeof a);                                               \
                memcpy(&b, g + i, sizeof b);                                               \
                NAME##_v ae = (NAME##_v)((NAME##_m)a & ABSMASK);                           \
                NAME##_v be = (NAME##_v)((NAME##_m)b & ABSMASK);                           \
                NAME##_m fin = (ae <= big) & (be <= big);                                  \
                NAME##_m same = (a == b) | ((a != a) & (b != b));                          \
                k_nan -= ~fin & ~same;                                                     \
                NAME##_v d = a - b;                                                        \
                d = (NAME##_v)((NAME##_m)d & ABSMASK & fin);                               \
                if (MEAS) { /* a constant: the plain instance has none of it */             \
                NAME##_v fa = (NAME##_v)((NAME##_m)a & fin);                               \
                NAME##_v fb = (NAME##_v)((NAME##_m)b & fin);                               \
                for (int p = 0; p < SPLIT; p++) {                                          \
                    NAME##_d xa = SBS_D4(fa, p * 4), xb = SBS_D4(fb, p * 4);                \
                    NAME##_d xd = SBS_D4(d, p * 4);                                        \
                    d_ee[p] += xa * xa;                                                    \
                    d_gg[p] += xb * xb;                                                    \
                    d_eg[p] += xa * xb;                                                    \
                    d_dd[p] += xd * xd;                                                    \
                }                                                                          \
                NAME##_m ia = (NAME##_m)a, ib = (NAME##_m)b;                               \
                NAME##_m sa = ia >> SIGNSHIFT, sb = ib >> SIGNSHIFT;                       \
                NAME##_m ka = ((ia & ABSMASK) ^ sa) - sa, kb = ((ib & ABSMASK) ^ sb) - sb; \
                NAME##_m upk = ka > kb;                                                    \
                NAME##_u hi = (NAME##_u)((ka & upk) | (kb & ~upk));                        \
                NAME##_u lo = (NAME##_u)((kb & upk) | (ka & ~upk));                        \
                NAME##_u u = (hi - lo) & (NAME##_u)fin;                                    \
                NAME##_u more = (NAME##_u)(u > vulp);                                      \
                vulp = (u & more) | (vulp & ~more);                                        \
                if (keys != NULL) { /* +inf where the non-finite sides disagree */        \
                    NAME##_m key = (NAME##_m)d | (~fin & ~same & vinf);                    \
                    memcpy(keys + i, &key, sizeof key);                                    \
                }                                                                          \
                }                                                                          \
                ae = (NAME##_v)((NAME##_m)ae & fin);                                       \
                NAME##_m up = d > vm;                                                      \
                vm = (NAME##_v)(((NAME##_m)d & up) | ((NAME##_m)vm & ~up));                \
                NAME##_v r = d / (ae + vadd);                                              \
                up = r > vrel;                                                             \
                vrel = (NAME##_v)(((NAME##_m)r & up) | ((NAME##_m)vrel & ~up));            \
                k01 -= d > v01;                                                            \
                k001 -= d > v001;                                                          \
                k_fail -= ~(d <= ae * vr + va);                                            \
            }                                                                              \
            for (int k = 0; k < LANES; k++) {                                              \
                m = vm[k] > m ? vm[k] : m;                                                 \
                rel = vrel[k] > rel ? vrel[k] : rel;                                       \
                c_nan += k_nan[k];                                                         \
                c01 += k01[k];                                                             \
                c001 += k001[k];                                                           \
                c_fail += k_fail[k];                                                       \
                see += d_ee[k / H][k % H];                                                 \
                sgg += d_gg[k / H][k % H];                                                 \
                seg += d_eg[k / H][k % H];                                                 \
                sdd += d_dd[k / H][k % H];                                                 \
                ulp = vulp[k] > ulp ? vulp[k] : ulp;                                       \
            }                                                                              \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            T a = e[i], b = g[i];                                                          \
            T ae = a < 0 ? -a : a, be = b < 0 ? -b : b;                                    \
            if (!(ae <= MAXV) || !(be <= MAXV)) {                                          \
                int same = a == b || (a != a && b != b);                                   \
                c_nan += !same;                                                            \
                if (MEAS && keys != NULL) keys[i] = same ? 0 : (UT)INFBITS;                \
                continue;                                                                  \
            }                                                                              \
            T d = a - b;                                                                   \
            d = d < 0 ? -d : d;                                                            \
            m = d > m ? d : m;                                                             \
            T r = d / (ae + r_add);                                                        \
            rel = r > rel ? r : rel;                                                       \
            c01 += d > t01;                                                                \
            c001 += d > t001;                                                              \
            c_fail += !(d <= ae * r_tol + a_tol);                                          \
            if (MEAS) {                                                                    \
            see += (double)a * (double)a;                                                  \
            sgg += (double)b * (double)b;                                                  \
            seg += (double)a * (double)b;                                                  \
            sdd += (double)d * (double)d;                                                  \
            IT ia, ib;                                                                     \
            memcpy(&ia, &a, sizeof ia);                                                    \
            memcpy(&ib, &b, sizeof ib);                                                    \
            IT ka = ia < 0 ? -(ia & ABSMASK) : ia, kb = ib < 0 ? -(ib & ABSMASK) : ib;     \
            UT u = ka > kb ? (UT)ka - (UT)kb : (UT)kb - (UT)ka;                            \
            ulp = u > ulp ? u : ulp;                                                       \
            if (keys != NULL) { /* |d| with -0.0 as 0 */                                   \
                UT kd;                                                                     \
                memcpy(&kd, &d, sizeof kd);                                                \
                keys[i] = kd & (UT)ABSMASK;                                                \
            }                                                                              \
            }                                                                              \
        }                                                                                  \
        out[0] = (double)m;                                                                \
        out[1] = (double)rel;                                                              \
        out[2] = (double)c_nan;                                                            \
        out[3] = (double)c01;                                                              \
        out[4] = (double)c001;                                                             \
        out[5] = (double)c_fail;                                                           \
        out[6] = see;                                                                      \
        out[7] = sgg;                                                                      \
        out[8] = seg;                                                                      \
        out[9] = sdd;                                                                      \
        out[10] = (double)ulp;                                                             \
        return 0;                                                                          \
    }

SBS_COMPARE(sbs_compare_f32, float, int32_t, uint32_t, 8, FLT_MAX, 0x7fffffff, 31, 0x7f800000, 2, 1)
SBS_COMPARE(sbs_compare_f64, double, int64_t, uint64_t, 4, DBL_MAX, 0x7fffffffffffffffLL, 63,
            0x7ff0000000000000LL, 1, 1)
/* without the measures (compare(..., False)): today's cost, for a run that does not want them */
SBS_COMPARE(sbs_plain_f32, float, int32_t, uint32_t, 8, FLT_MAX, 0x7fffffff, 31, 0x7f800000, 2, 0)
SBS_COMPARE(sbs_plain_f64, double, int64_t, uint64_t, 4, DBL_MAX, 0x7fffffffffffffffLL, 63,
            0x7ff0000000000000LL, 1, 0)

/* Order statistics of |e - g| (in the arrays' precision; 0 where both sides hold the same
 * non-finite value, +inf where they disagree), exactly, without sorting: the keys are
 * the bits of |e - g| (non-negative floats order as their bits do).  A histogram of the
 * HBITS bits below the keys' sign bit (always 0) finds the bin of each rank, one more
 * pass over the keys gathers those of these bins and a selection in each gives the rank.
 * Zero keys (equal values, most of a well exported node's) are not gathered: zero is the
 * smallest key, so a rank below their count is 0 without a selection.
 * HBITS is 12 for float32 (the exponent and 4 bits of mantissa) and 13 for float64 (2
 * bits of mantissa): counts of 32 bits, two histograms of at most 16 or 32 KiB that stay
 * in the cache, zeroed per call only up to the bin of the largest key (the comparison's
 * max |e - g| tells it: the bins of large differences are never touched).
 * Small arrays (3072 keys or fewer) skip the histogram: all keys are selected in place.
 * The keys come from the comparison's own pass (compare(..., ranks)) or, for ranks(),
 * from a pass of their own; beyond SBS_KEPT keys they are computed again in each pass
 * rather than doubling a large weight's memory. */
#define SBS_KEPT ((int64_t)1 << 22) /* keys kept between the two passes, at most */
#define SBS_SMALL 3072              /* below this the histogram costs more than a selection */
#define SBS_CHUNK ((int64_t)1 << 31) /* keys counted in 32 bits before they are added up */
#define SBS_KEYS(NAME, T, UT, MAXV, INFBITS, HBITS)                                        \
    typedef UT NAME##_kv __attribute__((vector_size(32)));                                 \
    static inline UT NAME##_key(T a, T b) {                                                \
        T ae = a < 0 ? -a : a, be = b < 0 ? -b : b;                                        \
        if (!(ae <= MAXV) || !(be <= MAXV))                                                \
            return (a == b || (a != a && b != b)) ? 0 : (UT)INFBITS;                       \
        T d = a - b;                                                                       \
        UT k;                                                                              \
        memcpy(&k, &d, sizeof k);                                                          \
        return k & (((UT)1 << (sizeof(UT) * 8 - 1)) - 1); /* |d|, -0.0 included */         \
    }                                                                                      \
    /* the k-th smallest of x[0..n) (k < n), reordering x */                               \
    static UT NAME##_select(UT *x, int64_t n, int64_t k) {                                 \
        int64_t lo = 0, hi = n - 1;                                                        \
        while (hi > lo) {                                                                  \
            int64_t mid = lo + (hi - lo) / 2;                                              \
            UT p0 = x[lo], p1 = x[mid], p2 = x[hi];                                        \
            UT pivot = p0 < p1 ? (p1 < p2 ? p1 : (p0 < p2 ? p2 : p0))                      \
                               : (p0 < p2 ? p0 : (p1 < p2 ? p2 : p1));                     \
            int64_t i = lo, j = hi;                                                        \
            while (i <= j) {                                                               \
                while (x[i] < pivot) i++;                                                  \
                while (x[j] > pivot) j--;                                                  \
                if (i <= j) {                                                              \
                    UT t = x[i];                                                           \
                    x[i] = x[j];                                                           \
                    x[j] = t;                                                              \
                    i++;                                                                   \
                    j--;                                                                   \
                }                                                                          \
            }                                                                              \
            if (k <= j) hi = j;                                                            \
            else if (k >= i) lo = i;                                                       \
            else return x[k];                                                              \
        }                                                                                  \
        return x[k];                                                                       \
    }                                                                                      \
    static void NAME##_put(double *out, UT k) {                                            \
        T v;                                                                               \
        memcpy(&v, &k, sizeof v);                                                          \
        *out = (double)v;                                                                  \
    }                                                                                      \
    /* out[r] = the ranks[r]-th smallest of x[0..n), reordering x */                       \
    static void NAME##_in_place(UT *x, int64_t n, const int64_t *ranks, int nr,            \
                                double *out) {                                             \
        int64_t base = 0; /* after a selection of rank b, x[b..n) holds the rest */         \
        for (int r = 0; r < nr; r++) {                                                     \
            NAME##_put(out + r, NAME##_select(x + base, n - base, ranks[r] - base));       \
            base = ranks[r];                                                               \
        }                                                                                  \
    }                                                                                      \
    /* the ranks by histogram; keys: the n keys, or NULL (computed from e and g in each  \
     * pass); -1 when out of memory */                                                     \
    /* the keys of the bins in slot[] (their slot + 1; 0: none), zero keys left out,     \
     * appended to x[slot]: eight (or four) keys tested at once, most hold none */         \
    SBS_CLONES static void NAME##_gather(const UT *keys, int64_t n, int shift,             \
                                         const unsigned char *slot, const int64_t *bins,   \
                                         int nb, UT **x, int64_t *fill) {                  \
        enum { KL = 32 / sizeof(UT) };                                                     \
        NAME##_kv vb[8];                                                                   \
        for (int s = 0; s < nb; s++) vb[s] = (NAME##_kv){0} + (UT)bins[s];                 \
        NAME##_kv lane_bit; /* lane t: 1 << t */                                           \
        for (int t = 0; t < KL; t++) lane_bit[t] = (UT)1 << t;                             \
        int64_t j = 0;                                                                     \
        for (; j + KL <= n; j += KL) {                                                     \
            NAME##_kv k;                                                                   \
            memcpy(&k, keys + j, sizeof k);                                                \
            NAME##_kv b = k >> shift;                                                      \
            __typeof__(b == b) hit = b == vb[0];                                           \
            for (int s = 1; s < nb; s++) hit |= b == vb[s];                                \
            hit &= k != 0;                                                                 \
            uint64_t w[4];                                                                 \
            memcpy(w, &hit, sizeof w);                                                     \
            if ((w[0] | w[1] | w[2] | w[3]) == 0) continue;                                \
            /* one bit per lane that hits: only those keys are looked up again */         \
            NAME##_kv lit = (NAME##_kv)hit & lane_bit;                                     \
            unsigned mask = 0;                                                             \
            for (int t = 0; t < KL; t++) mask |= (unsigned)lit[t];                         \
            while (mask != 0) {                                                            \
                UT kk = keys[j + __builtin_ctz(mask)];                                     \
                int s = slot[kk >> shift]; /* not 0: its bin is one of bins[] */           \
                x[s - 1][fill[s - 1]++] = kk;                                              \
                mask &= mask - 1;                                                          \
            }                                                                              \
        }                                                                                  \
        for (; j < n; j++) {                                                               \
            UT kk = keys[j];                                                               \
            int s = slot[kk >> shift];                                                     \
            if (s != 0 && kk != 0) x[s - 1][fill[s - 1]++] = kk;                           \
        }                                                                                  \
    }                                                                                      \
    /* top: no key is larger (the bins above its bin are neither zeroed nor read) */      \
    static int NAME##_hist(const UT *keys, const T *e, const T *g, int64_t n, UT top,      \
                           const int64_t *ranks, int nr, double *out) {                    \
        const int shift = (int)(sizeof(UT) * 8 - 1 - HBITS);                               \
        const int64_t nbins = (int64_t)((top & (((UT)1 << (sizeof(UT) * 8 - 1)) - 1)) >> shift) + 1; \
        /* two histograms, even and odd positions: runs of keys in one bin (zeros) would \
         * otherwise wait on each other's increment */                                     \
        uint32_t *h0 = malloc((size_t)nbins * 2 * sizeof(uint32_t)), *h1 = h0 + nbins;     \
        int64_t *total = n > SBS_CHUNK ? calloc((size_t)nbins, sizeof(int64_t)) : NULL;     \
        if (h0 == NULL || (total == NULL && n > SBS_CHUNK)) {                              \
            free(h0);                                                                      \
            free(total);                                                                   \
            return -1;                                                                     \
        }                                                                                  \
        memset(h0, 0, (size_t)nbins * 2 * sizeof(uint32_t));                               \
        for (int64_t c0 = 0; c0 < n; c0 += SBS_CHUNK) {                                    \
            int64_t c1 = n - c0 > SBS_CHUNK ? c0 + SBS_CHUNK : n, i = c0;                  \
            if (keys != NULL) {                                                            \
                for (; i + 1 < c1; i += 2) {                                               \
                    h0[keys[i] >> shift]++;                                                \
                    h1[keys[i + 1] >> shift]++;                                            \
                }                                                                          \
            } else {                                                                       \
                for (; i + 1 < c1; i += 2) {                                               \
                    h0[NAME##_key(e[i], g[i]) >> shift]++;                                 \
                    h1[NAME##_key(e[i + 1], g[i + 1]) >> shift]++;                         \
                }                                                                          \
            }                                                                              \
            if (i < c1) h0[(keys != NULL ? keys[i] : NAME##_key(e[i], g[i])) >> shift]++;  \
            if (total != NULL) {                                                           \
                for (int64_t b = 0; b < nbins; b++) total[b] += (int64_t)h0[b] + h1[b];    \
                memset(h0, 0, (size_t)nbins * 2 * sizeof(uint32_t));                       \
            }                                                                              \
        }                                                                                  \
        /* per rank: its bin, the keys below that bin, its slot (ranks ascend) */         \
        int64_t bin[8], before[8], slot_bin[8], c = 0, b = 0;                              \
        int slot_of[8], nb = 0;                                                            \
        for (int r = 0; r < nr; r++) {                                                     \
            for (;;) {                                                                     \
                int64_t here = total != NULL ? total[b] : (int64_t)h0[b] + h1[b];          \
                if (c + here > ranks[r]) break;                                            \
                c += here;                                                                 \
                b++;                                                                       \
            }                                                                              \
            bin[r] = b;                                                                    \
            before[r] = c;                                                                 \
            if (nb == 0 || slot_bin[nb - 1] != b) slot_bin[nb++] = b;                      \
            slot_of[r] = nb - 1;                                                           \
        }                                                                                  \
        /* one buffer per bin, filled in one pass; zero keys (bin 0) not stored */         \
        UT *x[8] = {NULL};                                                                 \
        int64_t fill[8] = {0};                                                             \
        unsigned char *slot = NULL;                                                        \
        int rc = 0;                                                                        \
        for (int s = 0; s < nb && rc == 0; s++) {                                          \
            int64_t sb = slot_bin[s];                                                      \
            int64_t count = total != NULL ? total[sb] : (int64_t)h0[sb] + h1[sb];          \
            x[s] = malloc((size_t)count * sizeof(UT));                                     \
            if (x[s] == NULL) rc = -1;                                                     \
        }                                                                                  \
        int64_t zeros = 0; /* zero keys, counted where bin 0 holds a rank */               \
        if (rc == 0 && nb && (slot = calloc((size_t)nbins, 1)) == NULL) rc = -1;           \
        if (rc == 0 && nb) {                                                               \
            for (int s = 0; s < nb; s++) slot[slot_bin[s]] = (unsigned char)(s + 1);        \
            if (keys != NULL) {                                                            \
                NAME##_gather(keys, n, shift, slot, slot_bin, nb, x, fill);                \
            } else {                                                                       \
                for (int64_t j = 0; j < n; j++) {                                          \
                    UT k = NAME##_key(e[j], g[j]);                                         \
                    int s = slot[k >> shift];                                              \
                    if (s != 0 && k != 0) x[s - 1][fill[s - 1]++] = k;                     \
                }                                                                          \
            }                                                                              \
            if (slot_bin[0] == 0)                                                          \
                zeros = (total != NULL ? total[0] : (int64_t)h0[0] + h1[0]) - fill[0];     \
        }                                                                                  \
        if (rc == 0) {                                                                     \
            int64_t from[8] = {0}; /* per slot: the ranks below it already selected */     \
            for (int r = 0; r < nr; r++) {                                                 \
                int s = slot_of[r];                                                        \
                /* its place among the bin's stored keys (bin 0's zeros not stored) */    \
                int64_t at = ranks[r] - before[r] - (bin[r] == 0 ? zeros : 0);             \
                if (at < 0) { /* zero is the smallest key */                               \
                    NAME##_put(out + r, 0);                                                \
                    continue;                                                              \
                }                                                                          \
                UT k = NAME##_select(x[s] + from[s], fill[s] - from[s], at - from[s]);     \
                from[s] = at;                                                              \
                NAME##_put(out + r, k);                                                    \
            }                                                                              \
        }                                                                                  \
        for (int s = 0; s < nb; s++) free(x[s]);                                           \
        free(slot);                                                                        \
        free(total);                                                                       \
        free(h0);                                                                          \
        return rc;                                                                         \
    }                                                                                      \
    /* out[r] = the ranks[r]-th smallest of the n keys (reordered), none larger than top;  \
     * -1: out of memory */                                                                \
    static int NAME##_of_keys(UT *keys, int64_t n, UT top, const int64_t *ranks, int nr,   \
                              double *out) {                                               \
        if (n <= SBS_SMALL) {                                                              \
            NAME##_in_place(keys, n, ranks, nr, out);                                      \
            return 0;                                                                      \
        }                                                                                  \
        return NAME##_hist(keys, NULL, NULL, n, top, ranks, nr, out);                      \
    }                                                                                      \
    /* out[r] = the ranks[r]-th smallest key of e and g; -1 when out of memory */          \
    static int NAME(const T *e, const T *g, int64_t n, const int64_t *ranks, int nr,       \
                    double *out) {                                                         \
        if (n > SBS_KEPT) return NAME##_hist(NULL, e, g, n, (UT)INFBITS, ranks, nr, out);  \
        UT *keys = malloc((size_t)(n ? n : 1) * sizeof(UT));                               \
        if (keys == NULL) return -1;                                                       \
        for (int64_t i = 0; i < n; i++) keys[i] = NAME##_key(e[i], g[i]);                  \
        int rc = NAME##_of_keys(keys, n, (UT)INFBITS, ranks, nr, out);                     \
        free(keys);                                                                        \
        return rc;                                                                         \
    }

SBS_KEYS(sbs_ranks_f32, float, uint32_t, FLT_MAX, 0x7f800000u, 12)
SBS_KEYS(sbs_ranks_f64, double, uint64_t, DBL_MAX, 0x7ff0000000000000ull, 13)

/* Whether b (cols x rows, C order) is a (rows x cols, C order) transposed, byte for
 * byte: a transposed weight against its twin.  A tile of a is read row by row (each row
 * a contiguous run), transposed into a buffer that stays in the cache, and compared
 * with the rows of b: neither array is walked across the cache. */
#define SBS_TILE 32
#define SBS_TRANSPOSED(NAME, T)                                                            \
    static int NAME(const T *a, const T *b, int64_t rows, int64_t cols) {                  \
        T buf[SBS_TILE][SBS_TILE];                                                         \
        for (int64_t i0 = 0; i0 < rows; i0 += SBS_TILE) {                                  \
            int64_t ni = rows - i0 < SBS_TILE ? rows - i0 : SBS_TILE;                      \
            for (int64_t j0 = 0; j0 < cols; j0 += SBS_TILE) {                              \
                int64_t nj = cols - j0 < SBS_TILE ? cols - j0 : SBS_TILE;                  \
                for (int64_t i = 0; i < ni; i++) {                                         \
                    const T *row = a + (i0 + i) * cols + j0;                               \
                    for (int64_t j = 0; j < nj; j++) buf[j][i] = row[j];                   \
                }                                                                          \
                for (int64_t j = 0; j < nj; j++)                                           \
                    if (memcmp(buf[j], b + (j0 + j) * rows + i0, (size_t)ni * sizeof(T)))  \
                        return 0;                                                          \
            }                                                                              \
        }                                                                                  \
        return 1;                                                                          \
    }

SBS_TRANSPOSED(transposed_u8, uint8_t)
SBS_TRANSPOSED(transposed_u16, uint16_t)
SBS_TRANSPOSED(transposed_u32, uint32_t)
SBS_TRANSPOSED(transposed_u64, uint64_t)

/* 4-byte items (float32 weights, the common case) in 8 x 8 blocks transposed in
 * registers: the tiled copy above moves one item per instruction, this moves eight, and
 * a block of b is compared as it is loaded.  Rows of a are taken 16 at a time, so each
 * 64-byte line of b is read once.  Edges that do not fill a block go to the tiled copy. */
typedef uint32_t sbs_u32x8 __attribute__((vector_size(32)));
typedef int32_t sbs_i32x8 __attribute__((vector_size(32)));
#if defined(__clang__)
#define SBS_SHUF(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define SBS_SHUF(x, y, ...) __builtin_shuffle(x, y, (sbs_i32x8){__VA_ARGS__})
#endif

#define SBS_INLINE static inline __attribute__((always_inline))

SBS_INLINE sbs_u32x8 sbs_load8(const uint32_t *p) {
    sbs_u32x8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* nonzero when the 8 x 8 block of a at (i, j) differs from b's block at (j, i) */
SBS_INLINE uint32_t sbs_block_differs(const uint32_t *a, const uint32_t *b, int64_t i,
                                         int64_t j, int64_t rows, int64_t cols) {
    const uint32_t *p = a + i * cols + j;
    sbs_u32x8 r0 = sbs_load8(p), r1 = sbs_load8(p + cols), r2 = sbs_load8(p + 2 * cols),
              r3 = sbs_load8(p + 3 * cols), r4 = sbs_load8(p + 4 * cols),
              r5 = sbs_load8(p + 5 * cols), r6 = sbs_load8(p + 6 * cols),
              r7 = sbs_load8(p + 7 * cols);
    /* pairs of rows interleaved, then pairs of pairs, then the two 128-bit halves */
    sbs_u32x8 t0 = SBS_SHUF(r0, r1, 0, 8, 1, 9, 4, 12, 5, 13);
    sbs_u32x8 t1 = SBS_SHUF(r0, r1, 2, 10, 3, 11, 6, 14, 7, 15);
    sbs_u32x8 t2 = SBS_SHUF(r2, r3, 0, 8, 1, 9, 4, 12, 5, 13);
    sbs_u32x8 t3 = SBS_SHUF(r2, r3, 2, 10, 3, 11, 6, 14, 7, 15);
    sbs_u32x8 t4 = SBS_SHUF(r4, r5, 0, 8, 1, 9, 4, 12, 5, 13);
    sbs_u32x8 t5 = SBS_SHUF(r4, r5, 2, 10, 3, 11, 6, 14, 7, 15);
    sbs_u32x8 t6 = SBS_SHUF(r6, r7, 0, 8, 1, 9, 4, 12, 5, 13);
    sbs_u32x8 t7 = SBS_SHUF(r6, r7, 2, 10, 3, 11, 6, 14, 7, 15);
    sbs_u32x8 u0 = SBS_SHUF(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13);
    sbs_u32x8 u1 = SBS_SHUF(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);
    sbs_u32x8 u2 = SBS_SHUF(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13);
    sbs_u32x8 u3 = SBS_SHUF(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);
    sbs_u32x8 u4 = SBS_SHUF(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13);
    sbs_u32x8 u5 = SBS_SHUF(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15);
    sbs_u32x8 u6 = SBS_SHUF(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13);
    sbs_u32x8 u7 = SBS_SHUF(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
    const uint32_t *q = b + j * rows + i;
    sbs_u32x8 x = SBS_SHUF(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11) ^ sbs_load8(q);
    x |= SBS_SHUF(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11) ^ sbs_load8(q + rows);
    x |= SBS_SHUF(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11) ^ sbs_load8(q + 2 * rows);
    x |= SBS_SHUF(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11) ^ sbs_load8(q + 3 * rows);
    x |= SBS_SHUF(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15) ^ sbs_load8(q + 4 * rows);
    x |= SBS_SHUF(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15) ^ sbs_load8(q + 5 * rows);
    x |= SBS_SHUF(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15) ^ sbs_load8(q + 6 * rows);
    x |= SBS_SHUF(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15) ^ sbs_load8(q + 7 * rows);
    return x[0] | x[1] | x[2] | x[3] | x[4] | x[5] | x[6] | x[7];
}

/* whether the sub-matrix a[i0:i1, j0:j1] is b[j0:j1, i0:i1] transposed, item by item */
static int sbs_edge_equal_u32(const uint32_t *a, const uint32_t *b, int64_t i0, int64_t i1,
                              int64_t j0, int64_t j1, int64_t rows, int64_t cols) {
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++)
            if (a[i * cols + j] != b[j * rows + i]) return 0;
    return 1;
}

#define SBS_TILE32 64 /* rows (and columns) of a per tile: few pages of each side at once */

SBS_CLONES static int transposed_u32_blocks(const uint32_t *a, const uint32_t *b,
                                            int64_t rows, int64_t cols) {
    const int64_t rows16 = rows - rows % 16, cols16 = cols - cols % 16;
    const int64_t rows8 = rows - rows % 8, cols8 = cols - cols % 8;
    for (int64_t i0 = 0; i0 < rows16; i0 += SBS_TILE32) {
        int64_t i1 = i0 + SBS_TILE32 < rows16 ? i0 + SBS_TILE32 : rows16;
        for (int64_t j0 = 0; j0 < cols16; j0 += SBS_TILE32) {
            int64_t j1 = j0 + SBS_TILE32 < cols16 ? j0 + SBS_TILE32 : cols16;
            for (int64_t i = i0; i < i1; i += 16)
                for (int64_t j = j0; j < j1; j += 16)
                    if (sbs_block_differs(a, b, i, j, rows, cols) |
                        sbs_block_differs(a, b, i + 8, j, rows, cols) |
                        sbs_block_differs(a, b, i, j + 8, rows, cols) |
                        sbs_block_differs(a, b, i + 8, j + 8, rows, cols))
                        return 0;
        }
    }
    /* an 8-wide strip left at the bottom, then one at the right */
    for (int64_t i = rows16; i < rows8; i += 8)
        for (int64_t j = 0; j < cols8; j += 8)
            if (sbs_block_differs(a, b, i, j, rows, cols)) return 0;
    for (int64_t i = 0; i < rows16; i += 8)
        for (int64_t j = cols16; j < cols8; j += 8)
            if (sbs_block_differs(a, b, i, j, rows, cols)) return 0;
    return sbs_edge_equal_u32(a, b, 0, rows8, cols8, cols, rows, cols) &&
           sbs_edge_equal_u32(a, b, rows8, rows, 0, cols, rows, cols);
}

/* 1: equal, 0: not, -1: an item size this does not handle */
static int sbs_equal_transposed(const void *a, const void *b, int64_t rows, int64_t cols,
                         int64_t itemsize) {
    switch (itemsize) {
    case 1: return transposed_u8(a, b, rows, cols);
    case 2: return transposed_u16(a, b, rows, cols);
    case 4:
        return rows >= 8 && cols >= 8 ? transposed_u32_blocks(a, b, rows, cols)
                                      : transposed_u32(a, b, rows, cols);
    case 8: return transposed_u64(a, b, rows, cols);
    default: return -1;
    }
}

/* ------------------------------------------------------------------ the module */

/* A C-ordered buffer (numpy arrays, and anything else that offers one); its item type
 * from the format: 'f' float32, 'd' float64, others by size only. */
static int sbs_view(PyObject *o, Py_buffer *v) {
    return PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
}

/* the format's type letter in native byte order, 0 for anything else */
static char sbs_letter(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && PY_LITTLE_ENDIAN) || (*f == '>' && PY_BIG_ENDIAN))
        f++;
    return f[0] && !f[1] ? f[0] : 0;
}

/* -1 with an exception set unless a function got the number of arguments it takes */
static int sbs_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

/* views of two arrays of one size, or -1 with an exception set (both released) */
static int sbs_views(PyObject *x, PyObject *y, const char *name, Py_buffer *a, Py_buffer *b) {
    if (sbs_view(x, a) < 0) return -1;
    if (sbs_view(y, b) < 0) {
        PyBuffer_Release(a);
        return -1;
    }
    if (a->len != b->len || a->itemsize != b->itemsize) {
        PyBuffer_Release(a);
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "%s(): the two arrays differ in size or item size", name);
        return -1;
    }
    return 0;
}

/* long loops run without the GIL: a notebook's kernel (the widget) stays responsive */
#define SBS_LONG(nbytes) ((nbytes) >= (1 << 20))

/* a tuple of at most 8 ranks into ranks[], their number into *nr; -1 with an exception */
static int sbs_parse_ranks(PyObject *o, const char *name, int64_t *ranks, int *nr) {
    if (!PyTuple_Check(o) || PyTuple_Size(o) > 8) {
        PyErr_Format(PyExc_TypeError, "%s(): a tuple of at most 8 ranks", name);
        return -1;
    }
    *nr = (int)PyTuple_Size(o);
    for (int r = 0; r < *nr; r++) {
        ranks[r] = (int64_t)PyLong_AsLongLong(PyTuple_GetItem(o, r));
        if (ranks[r] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* NULL, or why these ranks cannot be taken of n keys */
static const char *sbs_bad_ranks(const int64_t *ranks, int nr, int64_t n, const char *what) {
    for (int r = 0; r < nr; r++)
        if (ranks[r] < 0 || ranks[r] >= n || (r && ranks[r] < ranks[r - 1])) return what;
    return NULL;
}

/* a tuple of the n doubles, or NULL with an exception set */
static PyObject *sbs_tuple(const double *out, int n) {
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *x = PyFloat_FromDouble(out[k]);
        /* PyTuple_SetItem (a function of the stable ABI) steals x */
        if (x == NULL || PyTuple_SetItem(t, k, x) < 0) {
            Py_DECREF(t);
            return NULL;
        }
    }
    return t;
}

/* compare(e, g, atol, rtol[, measures[, ranks]]): with ranks (and the measures), the
 * order statistics of ranks() follow the eleven values, from the same pass: its keys are
 * kept (up to SBS_KEPT of them) and selected only where the values differ (all 0 where
 * they do not: every key is then 0). */
static PyObject *py_compare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer e, g;
    int64_t ranks[8];
    int nr = 0;
    if (nargs != 5 && nargs != 6 && sbs_nargs(nargs, 4, "compare") < 0) return NULL;
    int meas = nargs >= 5 ? PyObject_IsTrue(args[4]) : 1;
    if (meas < 0) return NULL;
    int with_ranks = nargs == 6 && meas;
    if (with_ranks && sbs_parse_ranks(args[5], "compare", ranks, &nr) < 0) return NULL;
    double atol = PyFloat_AsDouble(args[2]), rtol = PyFloat_AsDouble(args[3]);
    if ((atol == -1.0 || rtol == -1.0) && PyErr_Occurred()) return NULL;
    if (sbs_views(args[0], args[1], "compare", &e, &g) < 0) return NULL;
    char letter = sbs_letter(&e);
    double out[11 + 8];
    const char *bad = NULL;
    PyObject *exc = PyExc_ValueError;
    int rc = 0;
    if (letter != sbs_letter(&g) || !((letter == 'f' && e.itemsize == 4) ||
                                      (letter == 'd' && e.itemsize == 8))) {
        bad = "compare(): float32 or float64 arrays of one type only";
        exc = PyExc_TypeError;
    } else {
        int64_t n = (int64_t)(e.len / e.itemsize);
        bad = sbs_bad_ranks(ranks, nr, n, "compare(): ranks must ascend and lie within the arrays");
    }
    if (bad == NULL) {
        int64_t n = (int64_t)(e.len / e.itemsize);
        void *keys = with_ranks && n <= SBS_KEPT ? malloc((size_t)(n ? n : 1) * e.itemsize) : NULL;
        if (with_ranks && n <= SBS_KEPT && keys == NULL) rc = -1;
        int long_loop = SBS_LONG(e.len);
        PyThreadState *ts = long_loop ? PyEval_SaveThread() : NULL;
        if (rc == 0 && letter == 'f')
            (meas ? sbs_compare_f32 : sbs_plain_f32)(e.buf, g.buf, n, atol, rtol, out, keys);
        else if (rc == 0)
            (meas ? sbs_compare_f64 : sbs_plain_f64)(e.buf, g.buf, n, atol, rtol, out, keys);
        if (rc == 0 && with_ranks) {
            if (out[0] == 0 && out[2] == 0) { /* no difference: every key is 0 */
                for (int r = 0; r < nr; r++) out[11 + r] = 0.0;
            } else if (keys != NULL && letter == 'f') {
                /* no key above max |e - g|, or +inf where non-finite values disagree */
                float top = (float)out[0];
                uint32_t bits;
                memcpy(&bits, &top, sizeof bits);
                if (out[2] != 0) bits = 0x7f800000u;
                rc = sbs_ranks_f32_of_keys(keys, n, bits, ranks, nr, out + 11);
            } else if (keys != NULL) {
                uint64_t bits;
                memcpy(&bits, &out[0], sizeof bits);
                if (out[2] != 0) bits = 0x7ff0000000000000ull;
                rc = sbs_ranks_f64_of_keys(keys, n, bits, ranks, nr, out + 11);
            } else {
                rc = letter == 'f' ? sbs_ranks_f32(e.buf, g.buf, n, ranks, nr, out + 11)
                                   : sbs_ranks_f64(e.buf, g.buf, n, ranks, nr, out + 11);
            }
        }
        if (long_loop) PyEval_RestoreThread(ts);
        free(keys);
    }
    PyBuffer_Release(&e);
    PyBuffer_Release(&g);
    if (bad != NULL) {
        PyErr_SetString(exc, bad);
        return NULL;
    }
    if (rc < 0) return PyErr_NoMemory();
    return sbs_tuple(out, meas ? 11 + nr : 6);
}

/* ranks(e, g, (r0, r1, ...)): the r-th smallest |e - g| for each r (ascending, at most
 * 8, each < the arrays' size), as floats; see SBS_KEYS */
static PyObject *py_ranks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer e, g;
    int64_t ranks[8];
    double out[8];
    int nr = 0;
    if (sbs_nargs(nargs, 3, "ranks") < 0) return NULL;
    if (sbs_parse_ranks(args[2], "ranks", ranks, &nr) < 0) return NULL;
    if (sbs_views(args[0], args[1], "ranks", &e, &g) < 0) return NULL;
    char letter = sbs_letter(&e);
    int64_t n = (int64_t)(e.len / (e.itemsize ? e.itemsize : 1));
    const char *bad = NULL;
    if (letter != sbs_letter(&g) || !((letter == 'f' && e.itemsize == 4) ||
                                      (letter == 'd' && e.itemsize == 8)))
        bad = "ranks(): float32 or float64 arrays of one type only";
    else
        bad = sbs_bad_ranks(ranks, nr, n, "ranks(): ranks must ascend and lie within the arrays");
    int rc = 0;
    if (bad == NULL) {
        int long_loop = SBS_LONG(e.len);
        PyThreadState *ts = long_loop ? PyEval_SaveThread() : NULL;
        if (letter == 'f')
            rc = sbs_ranks_f32(e.buf, g.buf, n, ranks, nr, out);
        else
            rc = sbs_ranks_f64(e.buf, g.buf, n, ranks, nr, out);
        if (long_loop) PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&e);
    PyBuffer_Release(&g);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (rc < 0) return PyErr_NoMemory();
    return sbs_tuple(out, nr);
}

static PyObject *py_same_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer a, b;
    if (sbs_nargs(nargs, 2, "same_bytes") < 0 || sbs_views(args[0], args[1], "same_bytes", &a, &b) < 0)
        return NULL;
    int long_loop = SBS_LONG(a.len);
    PyThreadState *ts = long_loop ? PyEval_SaveThread() : NULL;
    int same = memcmp(a.buf, b.buf, (size_t)a.len) == 0;
    if (long_loop) PyEval_RestoreThread(ts);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyBool_FromLong(same);
}

/* equal_transposed(a, b): whether C-ordered b holds 2-D a transposed, byte for byte;
 * None for an item size it does not handle */
static PyObject *py_equal_transposed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer a, b;
    if (sbs_nargs(nargs, 2, "equal_transposed") < 0 || sbs_views(args[0], args[1], "equal_transposed", &a, &b) < 0)
        return NULL;
    if (a.ndim != 2) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "equal_transposed(): the first array must be 2-D");
        return NULL;
    }
    int long_loop = SBS_LONG(a.len);
    PyThreadState *ts = long_loop ? PyEval_SaveThread() : NULL;
    int found = sbs_equal_transposed(a.buf, b.buf, a.shape[0], a.shape[1], a.itemsize);
    if (long_loop) PyEval_RestoreThread(ts);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (found < 0) Py_RETURN_NONE;
    return PyBool_FromLong(found);
}

static PyMethodDef sbs_methods[] = {
    {"compare", (PyCFunction)(void (*)(void))py_compare, METH_FASTCALL,
     "compare(e, g, atol, rtol[, measures=True[, ranks]]) -> (max |e - g|, max |e - g| / "
     "(|e| + atol), non-finite disagreements, count > 0.1, count > 0.01, count > atol + rtol "
     "|e|, sum e^2, sum g^2, sum e g, sum (e - g)^2, max ulp distance[, the r-th smallest "
     "|e - g| for each rank r])"},
    {"ranks", (PyCFunction)(void (*)(void))py_ranks, METH_FASTCALL,
     "ranks(e, g, ranks) -> the r-th smallest |e - g| for each rank r (ascending)"},
    {"same_bytes", (PyCFunction)(void (*)(void))py_same_bytes, METH_FASTCALL,
     "same_bytes(a, b) -> whether two C-ordered arrays hold the same bytes"},
    {"equal_transposed", (PyCFunction)(void (*)(void))py_equal_transposed, METH_FASTCALL,
     "equal_transposed(a, b) -> whether b holds 2-D a transposed (None: an item size not "
     "handled)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sbs_module = {
    PyModuleDef_HEAD_INIT, "_sbs_native", "One-pass comparisons (sbs_native.c).", -1,
    sbs_methods,
};

PyMODINIT_FUNC PyInit__sbs_native(void) {
    PyObject *m = PyModule_Create(&sbs_module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", SBS_NATIVE_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
