/* tests/emu/tmap_emu.h — the emulator's private encoding of a tensor map
 * (CUtensorMap: 16 opaque 64-bit words), shared by its encoder, the
 * emulated driver function cuTensorMapEncodeTiled (cudart.c), and its
 * reader, the emulated cp.async.bulk.tensor (dt_emu_tma_load, runtime.c).
 * Header only, so that test_emu_cudart (cudart.c without runtime.c) and
 * test_mma_emu link the same code. Plain C; also C++.
 *
 * The words (the hardware's own layout is undocumented; this one is ours):
 *   0      magic (low 32 bits) | data type << 32 | rank << 40 |
 *          interleave << 44 | swizzle << 48 | L2 promotion << 52 |
 *          OOB fill << 56
 *   1      global address
 *   2-6    globalDim[0..4] (elements; 0 past the rank)
 *   7-10   globalStrides of dimensions 1..4 (bytes; 0 past the rank)
 *   11     boxDim[0..4], 12 bits each
 *   12     elementStrides[0..4], 4 bits each
 *   13     a check word mixing words 0-12
 *   14-15  zero
 * A map that fails the magic, the check word or the zero words was not
 * written by the encoder (or was changed since): the reader rejects it. */
#ifndef DT_TEST_EMU_TMAP_EMU_H
#define DT_TEST_EMU_TMAP_EMU_H

#include <stdint.h>
#include <string.h>

#define DT_EMU_TMAP_MAGIC 0x706d7444u /* "Dtmp" */
#define DT_EMU_TMAP_MAX_RANK 5

/* A tensor map's fields, decoded. stride[0] is the element size; stride[i]
 * (1 <= i < rank) the driver's globalStrides[i - 1]. */
typedef struct dt_emu_tmap {
    uint32_t dtype, rank, interleave, swizzle, l2, oob;
    uint64_t addr;
    uint64_t dim[DT_EMU_TMAP_MAX_RANK];
    uint64_t stride[DT_EMU_TMAP_MAX_RANK];
    uint32_t box[DT_EMU_TMAP_MAX_RANK], estride[DT_EMU_TMAP_MAX_RANK];
} dt_emu_tmap;

static inline uint64_t dt_emu_tmap_check(const uint64_t w[16]) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 13; i++) {
        h ^= w[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    return h;
}

/* m's fields into the 16 words at `out` (any alignment). */
static inline void dt_emu_tmap_pack(void *out, const dt_emu_tmap *m) {
    uint64_t w[16] = {0};
    w[0] = (uint64_t)DT_EMU_TMAP_MAGIC | (uint64_t)(m->dtype & 0xff) << 32 |
           (uint64_t)(m->rank & 0xf) << 40 | (uint64_t)(m->interleave & 0xf) << 44 |
           (uint64_t)(m->swizzle & 0xf) << 48 | (uint64_t)(m->l2 & 0xf) << 52 |
           (uint64_t)(m->oob & 0xf) << 56;
    w[1] = m->addr;
    for (uint32_t i = 0; i < m->rank && i < DT_EMU_TMAP_MAX_RANK; i++) {
        w[2 + i] = m->dim[i];
        if (i > 0) w[7 + i - 1] = m->stride[i];
        w[11] |= (uint64_t)(m->box[i] & 0xfff) << (12 * i);
        w[12] |= (uint64_t)(m->estride[i] & 0xf) << (4 * i);
    }
    w[13] = dt_emu_tmap_check(w);
    memcpy(out, w, sizeof w);
}

/* The element size in bytes of CUtensorMapDataType t for the types the
 * emulator copies (UINT8 .. BFLOAT16 but FLOAT32_FTZ and the TFLOAT32 and
 * packed sub-byte types: those change or pack the data on the way, which
 * is not emulated); 0 for the others. */
static inline uint32_t dt_emu_tmap_esize(uint32_t t) {
    static const uint8_t size[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2};
    return t < sizeof size ? size[t] : 0;
}

/* The 16 words at `in` decoded into m: 0, or -1 if they are not a map
 * dt_emu_tmap_pack wrote (m is then unspecified). */
static inline int dt_emu_tmap_unpack(const void *in, dt_emu_tmap *m) {
    uint64_t w[16];
    memcpy(w, in, sizeof w);
    if ((uint32_t)w[0] != DT_EMU_TMAP_MAGIC || w[13] != dt_emu_tmap_check(w) || w[14] || w[15])
        return -1;
    memset(m, 0, sizeof *m);
    m->dtype = (uint32_t)(w[0] >> 32 & 0xff);
    m->rank = (uint32_t)(w[0] >> 40 & 0xf);
    m->interleave = (uint32_t)(w[0] >> 44 & 0xf);
    m->swizzle = (uint32_t)(w[0] >> 48 & 0xf);
    m->l2 = (uint32_t)(w[0] >> 52 & 0xf);
    m->oob = (uint32_t)(w[0] >> 56 & 0xf);
    m->addr = w[1];
    if (m->rank < 1 || m->rank > DT_EMU_TMAP_MAX_RANK || !dt_emu_tmap_esize(m->dtype)) return -1;
    m->stride[0] = dt_emu_tmap_esize(m->dtype);
    for (uint32_t i = 0; i < m->rank; i++) {
        m->dim[i] = w[2 + i];
        if (i > 0) m->stride[i] = w[7 + i - 1];
        m->box[i] = (uint32_t)(w[11] >> (12 * i) & 0xfff);
        m->estride[i] = (uint32_t)(w[12] >> (4 * i) & 0xf);
        if (!m->dim[i] || !m->box[i] || m->box[i] > 256) return -1;   /* as the encoder checked */
    }
    return 0;
}

#endif /* DT_TEST_EMU_TMAP_EMU_H */
