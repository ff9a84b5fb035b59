/*
 * fuzz_tokenize.c - libFuzzer target for the tokenizers (text from HTTP clients and prompt
 * files reaches them unfiltered).
 *
 * At start-up it builds the tokenizers of the llama.cpp vocabularies in SHARED/vocab (SPM:
 * llama-spm, phi-3; BPE: gpt-2, falcon, deepseek-coder, deepseek-llm, starcoder) from the
 * FL_SHARED_DIR environment variable (the test sets it).  Each input's first byte picks a
 * vocabulary and the flags; the rest is the text, or, with one flag, a list of token ids.
 *
 * Text: tokenized with add_special / parse_special from the flags, optionally after making it
 * valid UTF-8 (most random bytes are not).  Invariants:
 *   - ill-formed UTF-8 fails with FL_ERR_INVALID and a message; well-formed text succeeds;
 *   - the count is the same whatever the buffer, and a short buffer gets the same first ids;
 *   - every id is in the vocabulary, a BOS comes first exactly when add_special and the vocab
 *     adds one;
 *   - without parse_special the pieces give the text back: detokenize (leading space removed)
 *     equals the text (an SPM vocabulary's space mark U+2581 in it given back as a space) for the
 *     vocabularies without llama.cpp's space clean-up, and the plain
 *     concatenation of fl_token_to_piece equals it for the others (in both, bytes the vocabulary
 *     has no token for may be missing, as in llama.cpp);
 *   - detokenize into a buffer one byte short fails with FL_ERR_RANGE.
 * Ids: each 2-byte pair is an id modulo the vocabulary (sometimes out of range on purpose);
 * fl_detokenize and fl_token_to_piece must agree on the length and never read or write past
 * the buffers, and out-of-range ids give -1.
 * Any crash, sanitizer report, tracked-memory change across one input or failed invariant aborts.
 *
 * Build: cmake -DFITLLM_FUZZ=ON -DCMAKE_C_COMPILER=clang (see tests/cli_fuzz.sh).
 */
#include "core/alloc.h"
#include "core/status.h"
#include "core/utf8.h"
#include "formats/gguf.h"
#include "model/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const VOCABS[] = {"llama-spm", "phi-3",   "gpt-2",       "falcon",
                                     "deepseek-coder", "deepseek-llm", "starcoder"};
enum { N_VOCABS = sizeof VOCABS / sizeof VOCABS[0] };

typedef struct {
    fl_tokenizer *t;
    int32_t n_vocab, max_piece, bos;
    bool spm, add_bos, cleans;
    bool lacks[256]; /* bytes with no token of their own (BPE vocabs without every byte) */
    bool lacks_any;
} vocab;

static vocab V[N_VOCABS];
static int n_loaded;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_tokenize: invariant failed: %s (%s)\n", what, fl_last_error());
        abort();
    }
}

/* Whether fl_detokenize cleans spaces for this vocabulary: llama.cpp's gpt-2 style vocabs
 * drop the space before punctuation, so a text with " ." does not come back.  Found out once
 * per vocabulary from " ." itself. */
static bool cleans(const vocab *v) {
    int32_t ids[8];
    int64_t n = 0;
    check(fl_tokenize(v->t, " .", 2, false, false, ids, 8, &n) == FL_OK && n <= 8, "tokenize ' .'");
    char buf[64];
    int64_t k = fl_detokenize(v->t, ids, n, buf, sizeof buf, true, false);
    return !(k == 2 && !memcmp(buf, " .", 2));
}

/* Bytes the vocabulary has no token for: SPM's byte-fallback <0xXX> tokens, or BPE's GPT-2
 * byte-to-unicode characters.  Several real vocabularies lack a few (falcon: 28 of them, among
 * them control characters): llama.cpp drops such a byte from the ids, and so does fitllm. */
static void find_lacking(vocab *v) {
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        char u[8];
        int l;
        if (v->spm) {
            l = snprintf(u, sizeof u, "<0x%02X>", b);
        } else {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            const unsigned cp = printable ? (unsigned)b : 256u + (unsigned)extra++;
            if (cp < 0x80) u[0] = (char)cp, l = 1;
            else u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), l = 2;
        }
        v->lacks[b] = fl_tokenizer_find(v->t, u, (size_t)l) < 0;
        v->lacks_any |= v->lacks[b];
    }
}

/* Whether got[0..n) equals want[0..len) with some of the bytes the vocabulary lacks left out. */
static bool equal_but_lacking(const vocab *v, const char *got, size_t n, const char *want, size_t len) {
    size_t i = 0;
    for (size_t j = 0; j < len; j++) {
        if (v->spm && i < n && got[i] == ' ' && len - j >= 3 && !memcmp(want + j, "\xe2\x96\x81", 3)) { /* SPM's space mark, in the text
                                                                                                       * too, comes back a space (as in llama.cpp) */
            i++;
            j += 2;
        } else if (i < n && got[i] == want[j]) i++;
        else if (!v->lacks[(unsigned char)want[j]]) return false;
    }
    return i == n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *shared = getenv("FL_SHARED_DIR");
    if (!shared) shared = "../shared";
    for (int i = 0; i < N_VOCABS; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", shared, VOCABS[i]);
        fl_gguf *g = NULL;
        if (fl_gguf_open(path, &g) != FL_OK) continue;
        fl_tokenizer *t = NULL;
        fl_status st = fl_tokenizer_new(g, &t);
        fl_gguf_free(g);
        if (st != FL_OK) {
            fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, fl_last_error());
            abort();
        }
        vocab *v = &V[n_loaded++];
        v->t = t;
        v->n_vocab = fl_tokenizer_n_vocab(t);
        v->max_piece = fl_tokenizer_max_piece(t);
        v->bos = fl_tokenizer_bos(t);
        v->spm = !strcmp(fl_tokenizer_kind(t), "llama");
        v->add_bos = fl_tokenizer_add_bos(t);
        v->cleans = cleans(v);
        find_lacking(v);
    }
    if (n_loaded == 0) {
        fprintf(stderr, "fuzz_tokenize: no vocabulary found under %s/vocab (set FL_SHARED_DIR)\n", shared);
        abort();
    }
    return 0;
}

static size_t mem_now[FL_MEM_COUNT];

static void mem_snapshot(void) {
    for (int c = 0; c < FL_MEM_COUNT; c++) mem_now[c] = fl_mem_current((fl_mem_cat)c);
}

static void mem_same(void) {
    for (int c = 0; c < FL_MEM_COUNT; c++) check(fl_mem_current((fl_mem_cat)c) == mem_now[c], "tracked memory unchanged");
}

static void fuzz_text(const vocab *v, const char *text, size_t len, bool add_special, bool parse_special) {
    int64_t bad = fl_utf8_invalid_at(text, len);
    int32_t small[4];
    int64_t n = -1;
    fl_status st = fl_tokenize(v->t, text, len, add_special, parse_special, small, 4, &n);
    if (bad >= 0) {
        check(st == FL_ERR_INVALID && fl_last_error()[0], "ill-formed UTF-8 is refused with a message");
        return;
    }
    check(st == FL_OK, "well-formed text tokenizes");
    check(n >= 0 && n <= (int64_t)len + 2, "at most one id per byte plus BOS/EOS");
    int64_t cap = n ? n : 1;
    int32_t *ids = fl_alloc(FL_MEM_MISC, (size_t)cap * sizeof *ids, 16);
    check(ids != NULL, "alloc ids");
    int64_t n2 = -1;
    check(fl_tokenize(v->t, text, len, add_special, parse_special, ids, cap, &n2) == FL_OK, "second call succeeds");
    check(n2 == n, "the count does not depend on the buffer");
    check(!memcmp(small, ids, (size_t)(n < 4 ? n : 4) * sizeof *ids), "a short buffer gets the same first ids");
    for (int64_t i = 0; i < n; i++) check(ids[i] >= 0 && ids[i] < v->n_vocab, "ids in the vocabulary");
    if (add_special && v->add_bos && v->bos >= 0) check(n >= 1 && ids[0] == v->bos, "BOS first");
    if (!add_special && !parse_special && v->bos >= 0 && fl_tokenizer_is_control(v->t, v->bos))
        for (int64_t i = 0; i < n; i++) check(ids[i] != v->bos, "no BOS from plain text");

    const int64_t bcap = n * (int64_t)v->max_piece + 2;
    char *buf = fl_alloc(FL_MEM_MISC, (size_t)bcap, 16);
    check(buf != NULL, "alloc text");
    int64_t k = fl_detokenize(v->t, ids, n, buf, bcap, true, false);
    check(k >= 0 && k < bcap && buf[k] == 0, "detokenize fits its bound");
    if (k > 0) {
        check(fl_detokenize(v->t, ids, n, buf, k, true, false) == -1, "one byte short fails");
        check(fl_detokenize(v->t, ids, n, buf, bcap, true, false) == k, "detokenize again");
    }
    if (!parse_special && !add_special) {
        if (!v->cleans) {
            check(equal_but_lacking(v, buf, (size_t)k, text, len), "detokenize(tokenize(x)) == x");
        } else {
            int64_t w = 0;
            for (int64_t i = 0; i < n; i++) {
                int32_t p = fl_token_to_piece(v->t, ids[i], buf + w, (int32_t)(bcap - w), false);
                check(p >= 0 && w + p < bcap, "piece fits");
                w += p;
            }
            check(equal_but_lacking(v, buf, (size_t)w, text, len), "the pieces concatenated give x back");
        }
    }
    fl_free(FL_MEM_MISC, buf, (size_t)bcap);
    fl_free(FL_MEM_MISC, ids, (size_t)cap * sizeof *ids);
}

static void fuzz_ids(const vocab *v, const uint8_t *d, size_t size, bool render_special, bool strip) {
    int64_t n = (int64_t)(size / 2);
    if (n == 0) return;
    int32_t *ids = fl_alloc(FL_MEM_MISC, (size_t)n * sizeof *ids, 16);
    check(ids != NULL, "alloc ids");
    bool any_bad = false;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)d[2 * i] | (uint32_t)d[2 * i + 1] << 8;
        /* the top values stand for ids just outside the vocabulary, and -1 */
        if (x >= 0xFFF0) ids[i] = x == 0xFFFF ? -1 : v->n_vocab + (int32_t)(x - 0xFFF0);
        else ids[i] = (int32_t)((x * 7919u) % (uint32_t)v->n_vocab);
        any_bad |= ids[i] < 0 || ids[i] >= v->n_vocab;
    }
    const int64_t bcap = n * (int64_t)v->max_piece + 2;
    char *buf = fl_alloc(FL_MEM_MISC, (size_t)bcap, 16);
    check(buf != NULL, "alloc text");
    int64_t k = fl_detokenize(v->t, ids, n, buf, bcap, strip, render_special);
    if (any_bad) {
        check(k == -1, "an id out of range gives -1");
    } else {
        check(k >= 0 && k < bcap && buf[k] == 0, "detokenize fits its bound");
        int64_t sum = 0;
        char piece[8];
        for (int64_t i = 0; i < n; i++) {
            int32_t p = fl_token_to_piece(v->t, ids[i], piece, sizeof piece, render_special);
            check(p >= 0 && p < (int32_t)sizeof piece && piece[p] == 0, "a piece is truncated to its buffer");
            int32_t full = fl_token_to_piece(v->t, ids[i], buf, (int32_t)bcap, render_special);
            check(full >= p && full <= v->max_piece, "piece within max_piece");
            sum += full;
        }
        /* the concatenation loses at most the stripped leading space and the cleaned-up ones */
        check(k <= sum, "detokenize no longer than its pieces");
    }
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] >= 0 && ids[i] < v->n_vocab) continue;
        check(fl_token_to_piece(v->t, ids[i], buf, (int32_t)bcap, render_special) == -1, "a bad id has no piece");
    }
    fl_free(FL_MEM_MISC, buf, (size_t)bcap);
    fl_free(FL_MEM_MISC, ids, (size_t)n * sizeof *ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 14) return 0;
    const uint8_t sel = data[0];
    const vocab *v = &V[(sel & 7) % n_loaded];
    const bool add_special = sel & 8, parse_special = sel & 16, sanitize = sel & 32, as_ids = sel & 64;
    data++, size--;
    mem_snapshot();
    if (as_ids) {
        fuzz_ids(v, data, size, add_special, parse_special);
    } else if (sanitize) {
        char *u = fl_alloc(FL_MEM_MISC, 3 * size + 1, 16);
        check(u != NULL, "alloc");
        size_t n = fl_utf8_sanitize((const char *)data, size, u);
        check(fl_utf8_is_valid(u, n), "sanitize gives well-formed UTF-8");
        fuzz_text(v, u, n, add_special, parse_special);
        fl_free(FL_MEM_MISC, u, 3 * size + 1);
    } else {
        fuzz_text(v, (const char *)data, size, add_special, parse_special);
    }
    mem_same();
    return 0;
}
