/* The rows of a float16 bank: read into float32, and written back from float32 with
 * stochastic rounding. The definitions (the noise, the rounding) are sample_fc/rounding.py's
 * NumPy code, which tests hold this file to bit for bit; rounding.py calls this extension and
 * falls back to its NumPy code when the extension was not built.
 *
 *   take(block, block_rows, width, rows, out)          out[i] = float32(block[rows[i]])
 *   put(block, block_rows, width, rows, values, classes, key)
 *                                                      block[rows[i]] = round(values[i]), the
 *                                                      noise of row i keyed by (key, classes[i])
 *   round_rows(values, width, classes, key, out)       out[i] = round(values[i])
 *
 * and the rows of an int8 momentum (bank_momentum=int8), whose definitions are
 * sample_fc/momentum_codec.py's NumPy code, held to it the same way:
 *
 *   take_int8(codes, scales, block_rows, width, rows, out)
 *                                                      out[i] = decode(codes, scales of rows[i])
 *   put_int8(codes, scales, block_rows, width, rows, values, classes, key)
 *                                                      codes, scales of rows[i] = encode(values[i]),
 *                                                      the noise of row i keyed by (key, classes[i]);
 *                                                      nothing written if any row is not finite
 *
 * Buffers are C-contiguous: block uint16 (block_rows x width), codes int8 (block_rows x width),
 * scales float32 (block_rows x ceil(width / 64)), rows/classes int64, values and out float32 or
 * uint16 (n x width). Every row index is checked before anything is touched. The GIL is
 * released while rows are converted, so threads can share a step's rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define NOISE_MASK 0x1FFFu          /* 13 noise bits: float32's mantissa minus float16's */
#define QBLOCK 64                   /* int8 momentum columns sharing one scale */
#define CODE_LIMIT 127.0f           /* int8 codes are in [-127, 127] */
#define CODE_NOISE_MASK 0xFFFFu     /* 16 noise bits per int8 code: u = noise / 2^16 */

static inline uint64_t mix(uint64_t z)      /* splitmix64's finalizer */
{
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint16_t round_one(uint32_t bits, uint32_t noise)
{
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t mag = bits & 0x7FFFFFFFu;
    /* normal range: add the noise below the kept bits, clear them, re-bias the exponent */
    uint32_t kept = (mag + noise) & 0xFFFFE000u;
    uint32_t exponent = kept >> 23;
    uint32_t normal = ((exponent - 112u) << 10) | ((kept >> 13) & 0x3FFu);
    normal = exponent >= 143u ? 0x7C00u : normal;
    /* below 2^-14: floor(|x| 2^24 + noise / 2^13) spacings of 2^-24, in integers */
    uint32_t e = mag >> 23;
    uint32_t mantissa = (mag & 0x7FFFFFu) | (e ? 0x800000u : 0u);
    int32_t shift = 113 - (int32_t)(e ? e : 1u);
    shift = shift < 0 ? 0 : (shift > 31 ? 31 : shift);
    uint32_t tiny = ((mantissa >> shift) + noise) >> 13;
    uint32_t half = mag < 0x38800000u ? tiny : normal;
    half = mag > 0x7F800000u ? 0x7E00u : half;           /* NaN stays NaN */
    return (uint16_t)(half | sign);
}

#define CHUNK 256               /* columns whose noise is made before they are rounded */

#if defined(HAVE_X86) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void round_row(const float *values, uint16_t *out, Py_ssize_t width, uint64_t row_key)
{
    const uint32_t *bits = (const uint32_t *)values;
    uint32_t noise[CHUNK];
    for (Py_ssize_t start = 0; start < width; start += CHUNK) {
        Py_ssize_t count = width - start < CHUNK ? width - start : CHUNK;
        for (Py_ssize_t g = 0; g < (count + 3) / 4; g++) {       /* 64 bits per 4 columns */
            uint64_t word = mix(row_key + (uint64_t)(start / 4 + g) * GOLDEN);
            for (int lane = 0; lane < 4; lane++)
                noise[4 * g + lane] = (uint32_t)(word >> (16 * lane)) & NOISE_MASK;
        }
        for (Py_ssize_t c = 0; c < count; c++)
            out[start + c] = round_one(bits[start + c], noise[c]);
    }
}

static inline uint64_t row_key(uint64_t key, int64_t class_id)
{
    return mix(key ^ ((uint64_t)class_id * GOLDEN));
}

static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, bits;
    float value;
    if (e == 0) {                                   /* zero or subnormal: m 2^-24, exact */
        value = (float)m * 5.9604644775390625e-8f;
        memcpy(&bits, &value, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7F800000u | (m << 13);
    } else {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&value, &bits, 4);
    return value;
}

static void take_row_portable(const uint16_t *src, float *dst, Py_ssize_t width)
{
    for (Py_ssize_t c = 0; c < width; c++)
        dst[c] = half_to_float(src[c]);
}

#ifdef HAVE_X86
__attribute__((target("avx,f16c")))
static void take_row_f16c(const uint16_t *src, float *dst, Py_ssize_t width)
{
    Py_ssize_t c = 0;
    for (; c + 8 <= width; c += 8)
        _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + c))));
    for (; c < width; c++)
        dst[c] = half_to_float(src[c]);
}

static int cpu_has_f16c(void)     /* F16C and AVX, with the OS saving the YMM registers */
{
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)) || !(c & (1u << 28)) || !(c & (1u << 29)))
        return 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
}
#endif

typedef void (*take_row_fn)(const uint16_t *, float *, Py_ssize_t);
static take_row_fn take_row = take_row_portable;

/* ---- int8 momentum: per block of QBLOCK columns, scale = max|m| / 127 and
 * code = clamp(floor(m / scale + noise / 2^16), -127, 127); a block of scale 0 codes 0 ---- */
static void encode_row(const float *values, int8_t *codes, float *scales, Py_ssize_t width, uint64_t row_key)
{
    for (Py_ssize_t start = 0; start < width; start += QBLOCK) {
        Py_ssize_t count = width - start < QBLOCK ? width - start : QBLOCK;
        float absmax = 0.0f;
        for (Py_ssize_t c = 0; c < count; c++) {
            float magnitude = fabsf(values[start + c]);
            absmax = magnitude > absmax ? magnitude : absmax;
        }
        float scale = absmax / CODE_LIMIT;
        scales[start / QBLOCK] = scale;
        if (scale == 0.0f) {
            memset(codes + start, 0, (size_t)count);
            continue;
        }
        for (Py_ssize_t g = 0; g < (count + 3) / 4; g++) {      /* 64 bits per 4 columns */
            uint64_t word = mix(row_key + (uint64_t)(start / 4 + g) * GOLDEN);
            for (Py_ssize_t lane = 0; lane < 4 && 4 * g + lane < count; lane++) {
                Py_ssize_t c = start + 4 * g + lane;
                float u = (float)((uint32_t)(word >> (16 * lane)) & CODE_NOISE_MASK) * (1.0f / 65536.0f);
                float code = floorf(values[c] / scale + u);
                code = code < -CODE_LIMIT ? -CODE_LIMIT : (code > CODE_LIMIT ? CODE_LIMIT : code);
                codes[c] = (int8_t)code;
            }
        }
    }
}

static void decode_row(const int8_t *codes, const float *scales, float *out, Py_ssize_t width)
{
    for (Py_ssize_t c = 0; c < width; c++)
        out[c] = (float)codes[c] * scales[c / QBLOCK];
}

/* The first of n rows of `values` holding a NaN or inf (all exponent bits set), or -1. */
static Py_ssize_t first_nonfinite_row(const float *values, Py_ssize_t n, Py_ssize_t width)
{
    const uint32_t *bits = (const uint32_t *)values;
    for (Py_ssize_t i = 0; i < n * width; i++)
        if ((bits[i] & 0x7F800000u) == 0x7F800000u)
            return i / width;
    return -1;
}

/* ---- argument checks ----------------------------------------------------------------- */
static int need_size(Py_buffer *buffer, Py_ssize_t bytes, const char *name)
{
    if (buffer->len < bytes) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, needs %zd", name, buffer->len, bytes);
        return 0;
    }
    return 1;
}

static int rows_in_range(const int64_t *rows, Py_ssize_t n, Py_ssize_t block_rows)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= block_rows) {
            PyErr_Format(PyExc_IndexError, "row %lld of a block of %zd rows", (long long)rows[i], block_rows);
            return 0;
        }
    }
    return 1;
}

/* ---- the functions ------------------------------------------------------------------- */
static PyObject *take(PyObject *self, PyObject *args)
{
    Py_buffer block, rows, out;
    Py_ssize_t block_rows, width;
    if (!PyArg_ParseTuple(args, "y*nny*w*", &block, &block_rows, &width, &rows, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = rows.len / 8;
    const int64_t *index = rows.buf;
    if (need_size(&block, block_rows * width * 2, "block") && need_size(&out, n * width * 4, "out")
        && rows_in_range(index, n, block_rows)) {
        const uint16_t *src = block.buf;
        float *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            take_row(src + index[i] * width, dst + i * width, width);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&block);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *put(PyObject *self, PyObject *args)
{
    Py_buffer block, rows, values, classes;
    Py_ssize_t block_rows, width;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "w*nny*y*y*K", &block, &block_rows, &width, &rows, &values, &classes, &key))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = rows.len / 8;
    const int64_t *index = rows.buf, *class_ids = classes.buf;
    if (need_size(&block, block_rows * width * 2, "block") && need_size(&values, n * width * 4, "values")
        && need_size(&classes, n * 8, "classes") && rows_in_range(index, n, block_rows)) {
        uint16_t *dst = block.buf;
        const float *src = values.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            round_row(src + i * width, dst + index[i] * width, width, row_key(key, class_ids[i]));
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&block);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&values);
    PyBuffer_Release(&classes);
    return result;
}

static PyObject *round_rows(PyObject *self, PyObject *args)
{
    Py_buffer values, classes, out;
    Py_ssize_t width;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "y*ny*Kw*", &values, &width, &classes, &key, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = classes.len / 8;
    if (need_size(&values, n * width * 4, "values") && need_size(&out, n * width * 2, "out")) {
        const float *src = values.buf;
        const int64_t *class_ids = classes.buf;
        uint16_t *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            round_row(src + i * width, dst + i * width, width, row_key(key, class_ids[i]));
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&values);
    PyBuffer_Release(&classes);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *take_int8(PyObject *self, PyObject *args)
{
    Py_buffer codes, scales, rows, out;
    Py_ssize_t block_rows, width;
    if (!PyArg_ParseTuple(args, "y*y*nny*w*", &codes, &scales, &block_rows, &width, &rows, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = rows.len / 8, groups = (width + QBLOCK - 1) / QBLOCK;
    const int64_t *index = rows.buf;
    if (need_size(&codes, block_rows * width, "codes") && need_size(&scales, block_rows * groups * 4, "scales")
        && need_size(&out, n * width * 4, "out") && rows_in_range(index, n, block_rows)) {
        const int8_t *src = codes.buf;
        const float *scale = scales.buf;
        float *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            decode_row(src + index[i] * width, scale + index[i] * groups, dst + i * width, width);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&codes);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *put_int8(PyObject *self, PyObject *args)
{
    Py_buffer codes, scales, rows, values, classes;
    Py_ssize_t block_rows, width;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "w*w*nny*y*y*K", &codes, &scales, &block_rows, &width, &rows, &values,
                          &classes, &key))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = rows.len / 8, groups = (width + QBLOCK - 1) / QBLOCK;
    const int64_t *index = rows.buf, *class_ids = classes.buf;
    if (need_size(&codes, block_rows * width, "codes") && need_size(&scales, block_rows * groups * 4, "scales")
        && need_size(&values, n * width * 4, "values") && need_size(&classes, n * 8, "classes")
        && rows_in_range(index, n, block_rows)) {
        int8_t *dst = codes.buf;
        float *scale = scales.buf;
        const float *src = values.buf;
        Py_ssize_t bad;
        Py_BEGIN_ALLOW_THREADS
        bad = first_nonfinite_row(src, n, width);          /* all rows checked before any is written */
        for (Py_ssize_t i = 0; bad < 0 && i < n; i++)
            encode_row(src + i * width, dst + index[i] * width, scale + index[i] * groups, width,
                       row_key(key, class_ids[i]));
        Py_END_ALLOW_THREADS
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError, "the momentum of class %lld is not finite (NaN or inf): "
                         "it cannot be stored as int8", (long long)class_ids[bad]);
        } else {
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&codes);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&values);
    PyBuffer_Release(&classes);
    return result;
}

static PyMethodDef methods[] = {
    {"take", take, METH_VARARGS, "take(block, block_rows, width, rows, out): float16 rows to float32"},
    {"put", put, METH_VARARGS, "put(block, block_rows, width, rows, values, classes, key): rounded rows in"},
    {"round_rows", round_rows, METH_VARARGS, "round_rows(values, width, classes, key, out): rounded rows"},
    {"take_int8", take_int8, METH_VARARGS,
     "take_int8(codes, scales, block_rows, width, rows, out): int8 momentum rows to float32"},
    {"put_int8", put_int8, METH_VARARGS,
     "put_int8(codes, scales, block_rows, width, rows, values, classes, key): int8 momentum rows in"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_half_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__half_rows(void)
{
#ifdef HAVE_X86
    if (cpu_has_f16c())
        take_row = take_row_f16c;
#endif
    return PyModule_Create(&module);
}
