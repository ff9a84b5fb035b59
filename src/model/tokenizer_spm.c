/*
 * tokenizer_spm.c - SentencePiece-style tokenization of one raw text fragment, as llama.cpp's
 * llm_tokenizer_spm does it:
 *   1. spaces become "▁" (U+2581); a "▁" is prefixed when the caller asks (leading-space rule);
 *   2. the text is split into UTF-8 characters, each a symbol in a doubly linked list;
 *   3. every adjacent pair whose concatenation is a vocabulary token goes into a max-heap keyed
 *      by that token's score (ties: the leftmost pair first); the best pair is merged, stale
 *      entries (a side already merged away or grown) are skipped, and the new neighbours are
 *      pushed, until the heap is empty;
 *   4. each final symbol is its token, or, if the text is not in the vocabulary (a character
 *      with no token), its bytes as <0xXX> byte-fallback tokens.
 * Working memory is charged to FL_MEM_SCRATCH and released before returning.
 */
#include "model/tokenizer_impl.h"

#include <string.h>

typedef struct spm_sym {
    int32_t off, n;     /* bytes [off, off + n) of the escaped text; n == 0 once merged away */
    int32_t prev, next; /* neighbours, -1 at the ends */
} spm_sym;

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    int32_t size; /* bytes of the merged text when pushed: stale if the symbols changed */
} spm_bigram;

/* Heap order: a before b if a's score is higher, or equal and a is further left. */
static bool bigram_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct spm_heap {
    spm_bigram *v;
    int64_t n, cap;
} spm_heap;

static fl_status heap_push(spm_heap *h, spm_bigram b) {
    if (h->n == h->cap) {
        int64_t nc = h->cap ? h->cap * 2 : 64;
        spm_bigram *nv = fl_realloc(FL_MEM_SCRATCH, h->v, (size_t)h->cap * sizeof *nv, (size_t)nc * sizeof *nv, 0);
        if (!nv) return fl_set_error(FL_ERR_NOMEM, "spm: out of memory (heap of %lld)", (long long)nc);
        h->v = nv;
        h->cap = nc;
    }
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!bigram_before(&b, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
    return FL_OK;
}

static spm_bigram heap_pop(spm_heap *h) {
    spm_bigram top = h->v[0], last = h->v[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->v[c + 1], &h->v[c])) c++;
        if (!bigram_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

/* Push the pair (left, right) if their concatenation is a token. */
static fl_status try_bigram(const fl_tokenizer *t, const char *s, const spm_sym *sym, int32_t left, int32_t right, spm_heap *h) {
    if (left < 0 || right < 0) return FL_OK;
    int32_t size = sym[left].n + sym[right].n;
    int32_t id = fl_tok_find(t, s + sym[left].off, (size_t)size);
    if (id < 0) return FL_OK;
    return heap_push(h, (spm_bigram){t->tokens[id].score, left, right, size});
}

/* Merge the symbols of one chunk s[0, n) (n > 0) and append its tokens.  sym and heap are
 * reused between chunks. */
static fl_status spm_chunk(const fl_tokenizer *t, const char *s, int32_t n, spm_sym *sym, spm_heap *heap, fl_idvec *out) {
    fl_status st = FL_OK;
    /* one symbol per UTF-8 character */
    int32_t n_sym = 0;
    for (int32_t off = 0; off < n;) {
        int32_t cl = fl_utf8_len((unsigned char)s[off]);
        if (cl > n - off) cl = n - off;
        sym[n_sym] = (spm_sym){off, cl, n_sym - 1, off + cl == n ? -1 : n_sym + 1};
        n_sym++;
        off += cl;
    }
    /* merge the best-scoring pairs */
    heap->n = 0;
    for (int32_t i = 1; i < n_sym && !st; i++) st = try_bigram(t, s, sym, i - 1, i, heap);
    while (heap->n > 0 && !st) {
        spm_bigram b = heap_pop(heap);
        spm_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        st = try_bigram(t, s, sym, l->prev, b.left, heap);
        if (!st) st = try_bigram(t, s, sym, b.left, l->next, heap);
    }
    /* emit tokens, falling back to bytes */
    for (int32_t i = 0; i != -1 && !st; i = sym[i].next) {
        int32_t id = fl_tok_find(t, s + sym[i].off, (size_t)sym[i].n);
        if (id >= 0) {
            st = fl_idvec_push(out, id);
            continue;
        }
        for (int32_t k = 0; k < sym[i].n && !st; k++) {
            int32_t bt = t->byte_tok[(unsigned char)s[sym[i].off + k]];
            if (bt < 0) bt = t->unk;
            if (bt < 0) {
                st = fl_set_error(FL_ERR_UNSUPPORTED, "spm: byte 0x%02x has no token and the vocabulary has no <unk>",
                                  (unsigned)(unsigned char)s[sym[i].off + k]);
                break;
            }
            st = fl_idvec_push(out, bt);
        }
    }
    return st;
}

static bool is_sp(const char *s) { return (unsigned char)s[0] == 0xe2 && (unsigned char)s[1] == 0x96 && (unsigned char)s[2] == 0x81; }

bool fl_spm_can_split(const fl_tokenizer *t) {
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *x = fl_tok_text(t, id);
        const uint32_t n = t->tokens[id].len;
        for (uint32_t p = 1; p + 3 <= n; p++)
            if (is_sp(x + p) && !(p >= 3 && is_sp(x + p - 3))) return false;
    }
    return true;
}

fl_status fl_spm_tokenize(const fl_tokenizer *t, const char *text, size_t len, bool add_prefix, fl_idvec *out) {
    static const char sp[3] = {(char)0xe2, (char)0x96, (char)0x81}; /* "▁" */
    size_t n_space = 0;
    for (size_t i = 0; i < len; i++) n_space += text[i] == ' ';
    const size_t elen = len + 2 * n_space + (add_prefix ? 3 : 0);
    if (elen == 0) return FL_OK;
    if (elen > INT32_MAX / 2) return fl_set_error(FL_ERR_RANGE, "spm: text fragment of %zu bytes is too long", len);

    fl_status st = FL_OK;
    spm_heap heap = {0};
    spm_sym *sym = NULL;
    size_t sym_cap = 0;
    char *s = fl_alloc(FL_MEM_SCRATCH, elen, 0);
    if (!s) {
        st = fl_set_error(FL_ERR_NOMEM, "spm: out of memory for a %zu-byte fragment", len);
        goto done;
    }
    /* escape spaces */
    size_t w = 0;
    if (add_prefix) memcpy(s, sp, 3), w = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(s + w, sp, 3), w += 3;
        else s[w++] = text[i];
    }
    /* Cut into chunks before each "▁" that follows another character, when no token contains
     * a character followed by "▁" (t->spm_split): no merge can then cross a cut, so the chunks
     * merge independently with the same result as the whole fragment, in far less memory. */
    for (size_t a = 0; a < elen && !st;) {
        size_t b = elen;
        if (t->spm_split)
            for (size_t i = a + 1; i + 3 <= elen; i++)
                if (is_sp(s + i) && !(i >= a + 3 && is_sp(s + i - 3))) { /* i starts a "▁" run */
                    b = i;
                    break;
                }
        if (b - a > sym_cap) {
            size_t nc = sym_cap ? sym_cap : 256;
            while (nc < b - a) nc *= 2;
            spm_sym *ns = fl_realloc(FL_MEM_SCRATCH, sym, sym_cap * sizeof(spm_sym), nc * sizeof(spm_sym), 0);
            if (!ns) {
                st = fl_set_error(FL_ERR_NOMEM, "spm: out of memory for %zu symbols", nc);
                break;
            }
            sym = ns;
            sym_cap = nc;
        }
        st = spm_chunk(t, s + a, (int32_t)(b - a), sym, &heap, out);
        a = b;
    }
done:
    if (heap.v) fl_free(FL_MEM_SCRATCH, heap.v, (size_t)heap.cap * sizeof(spm_bigram));
    if (sym) fl_free(FL_MEM_SCRATCH, sym, sym_cap * sizeof(spm_sym));
    if (s) fl_free(FL_MEM_SCRATCH, s, elen);
    return st;
}
