/* tests/harness.h — helpers shared by the cmocka suites.
 *
 * - h_launch: dt_launch on the CPU backend and the local transport with a
 *   short timeout (30 s unless DT_TIMEOUT_MS is set), so a broken collective
 *   fails a test instead of hanging the suite.
 * - h_compare: the stated tolerance |got - ref| <= atol + rtol*|ref|, with
 *   NaN/Inf checked explicitly; prints the first mismatches and the max error.
 * - Test-local index maps (h_order_indices) written from the orders'
 *   definitions (docs/ARCHITECTURE.md) by enumeration, independent of
 *   dtensor/layout.c, so that the expected data of a test never comes from
 *   the code under test.
 * - Case tables: tests build arrays of struct CMUnitTest whose names carry
 *   their parameters ("redistribute/P=3,...") and run them with h_run_cases.
 *
 * cmocka assertions must run on the main thread: rank functions only record
 * results; the test asserts after h_launch returns.
 */
#ifndef DT_TEST_HARNESS_H
#define DT_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/context.h"
#include "dtensor/layout.h"

#define H_MAX_RANKS 8

/* The library's source folders, lowest layer first (the Makefile's LIB_DIRS;
 * tests/test_layers.c keeps every #include to this order). */
#define H_LIB_DIRS {"base", "collectives", "dtensor", "attention", "attention/cuda"}
#define H_LIB_NDIRS 5

/* dt_launch(world, fn, arg) on cpu + local with the test timeout. */
dt_status h_launch(int world, dt_rank_fn fn, void *arg);

/* The same on a chosen (backend, transport) pair (AUTO picks as dt_launch
 * does). A pair this build or machine cannot run returns
 * DT_ERR_NOT_SUPPORTED with the reason in dt_last_error(). */
dt_status h_launch_on(int world, dt_backend_kind backend, dt_transport_kind transport,
                      dt_rank_fn fn, void *arg);

/* 1 if `world` ranks can run on (backend, transport) here; otherwise 0 and
 * the reason (dt_launch's message) in why. */
int h_pair_available(int world, dt_backend_kind backend, dt_transport_kind transport, char *why,
                     size_t why_size);

/* Number of i with |got[i] - ref[i]| > atol + rtol*|ref[i]| or got[i] not
 * finite while ref[i] is (or the other way round). Prints up to 5 of them,
 * prefixed with `what`, and the max error; *max_err (may be NULL) receives
 * the largest |got - ref|. */
long h_compare(const char *what, const float *got, const double *ref, size_t n, double atol,
               double rtol, double *max_err);

/* Global indices rank j of `parts` holds along a dim of length n, in local
 * order (out must hold n/parts entries):
 *   contiguous: the j-th of parts consecutive blocks;
 *   striped:    j, j+parts, j+2*parts, ...;
 *   zigzag:     of 2*parts equal chunks, chunk j and then chunk 2*parts-1-j. */
void h_order_indices(dt_order order, int64_t n, int parts, int j, int64_t *out);

/* Row-major coordinates of `rank` on a mesh (last mesh dim fastest). */
void h_coords(int rank, int mesh_ndim, const int *mesh_sizes, int *coords);

int64_t h_numel(int ndim, const int64_t *shape);

/* The part of a full row-major tensor (float) held at `coords` under
 * `layout` (Shard dims only; Partial/Replicate mesh dims keep everything):
 * writes local_shape (may be NULL) and the local tensor into out. */
void h_local_of(const float *full, int ndim, const int64_t *shape, const dt_layout *layout,
                const int *mesh_sizes, const int *coords, float *out, int64_t *local_shape);

/* Same for 16-bit elements (bf16 raw bits). */
void h_local_of_u16(const uint16_t *full, int ndim, const int64_t *shape, const dt_layout *layout,
                    const int *mesh_sizes, const int *coords, uint16_t *out);

/* Same for double (references). */
void h_local_of_f64(const double *full, int ndim, const int64_t *shape, const dt_layout *layout,
                    const int *mesh_sizes, const int *coords, double *out);

/* Like h_compare with a per-element bound: |got[i] - ref[i]| <= tol[i]. */
long h_compare_tol(const char *what, const float *got, const double *ref, const double *tol,
                   size_t n, double *max_err);

/* Sets (value != NULL) or unsets the environment variable `name`, on the
 * main thread while no rank thread runs; returns its previous value
 * (malloc'd, or NULL) for h_env_restore, which puts it back and frees it. */
char *h_env_set(const char *name, const char *value);
void h_env_restore(const char *name, char *saved);

/* Runs a table of n tests as one cmocka group; returns the number failed.
 * DT_TEST_FILTER, if set, runs only the tests whose names match it (cmocka's
 * pattern: * and ? wildcards), e.g. 'forward/cuda-kernels*'. */
struct CMUnitTest;
int h_run_cases(const char *group, const struct CMUnitTest *tests, size_t n);

/* Formats a Layout for test names: "R", "P", "S(1,striped)" per mesh dim,
 * joined by ','. */
void h_layout_short(const dt_layout *l, char *buf, size_t size);

/* Runs `program args` with its stderr merged into *out (malloc'd, NUL
 * terminated; the caller frees it). The program's backend is
 * $DT_EXAMPLE_BACKEND, cpu by default, so a suite gives the same results on
 * machines with and without a GPU. Returns the exit status, -1 if the program
 * did not exit normally, -2 if it could not be run. */
int h_run_program(const char *program, const char *args, char **out);

/* The first Python of $PYTHON, python3 and /usr/bin/python3 that runs
 * `import MODULES` (e.g. "numpy, torch"), or NULL: for the suites that run
 * the project's PyTorch scripts (Debian's python3-torch installs into
 * /usr/bin/python3, which PATH's python3 may not be). */
const char *h_python_with(const char *modules);

/* A whole file as a NUL-terminated string (malloc'd; the caller frees it),
 * or NULL if it cannot be read. */
char *h_read_text(const char *path);

#endif /* DT_TEST_HARNESS_H */
