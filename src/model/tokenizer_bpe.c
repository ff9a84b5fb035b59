/*
 * tokenizer_bpe.c - byte-level BPE (tokenizer.ggml.model = "gpt2"), as llama.cpp's
 * llm_tokenizer_bpe does it:
 *   1. pre-tokenization: the regexes of the tokenizer.ggml.pre kind are applied in sequence;
 *      each one splits every current fragment into its matches and the gaps between them
 *      (a regex only sees its fragment, so lookaheads stop at the fragment's end).  The
 *      regexes are run with libpcre2 in UTF + UCP mode (Unicode \p{L}, \p{N}, \p{P}, \s);
 *   2. each fragment's bytes are mapped to code points with GPT-2's bytes_to_unicode table;
 *   3. inside a fragment, the adjacent pair with the lowest merge rank is merged (ties: the
 *      leftmost) until no pair has a rank; with ignore_merges (Llama 3) a fragment that is
 *      itself a token is emitted whole;
 *   4. each symbol is its token; a symbol that is not in the vocabulary falls back to the
 *      one-byte tokens of its bytes that exist.
 * Compiled patterns are immutable and shared; match data is allocated per call.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer_impl.h"

#include <pcre2.h>
#include <pthread.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* pre-tokenizer regexes (the published patterns of each llama.cpp pre-tokenizer kind)        */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                              \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+" \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                               \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+" \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* DeepSeek LLM: cased letters of many scripts (a fixed list of ranges, not \p{L}) */
#define RE_DEEPSEEK_LETTERS                                                                          \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}" \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}" \
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"        \
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"     \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"     \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"                \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"               \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"     \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"       \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"                \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"               \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"      \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"     \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                    \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"               \
    "\\x{1E900}-\\x{1E943}]+"

typedef struct pre_kind {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *regex[6];
    bool ignore_merges, add_bos, clean_spaces;
} pre_kind;

static const pre_kind PRE_KINDS[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false, true},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", {RE_LLAMA3}, true, true, true},
    {"dbrx|smaug-bpe", {RE_LLAMA3}, false, false, true},
    {"deepseek-llm",
     {"[\\r\\n]", RE_DEEPSEEK_LETTERS, "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", RE_CJK, "\\p{N}+"},
     false, false, false},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}, false, false, false},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false, true},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", {"\\p{N}", RE_GPT2}, false, false, true},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code|roberta-bpe|mpt|olmo|jais",
     {RE_GPT2}, false, false, true},
    {"qwen2|deepseek-r1-qwen|stablelm2|megrez", {RE_QWEN2}, false, false, true},
};

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && memcmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

fl_status fl_bpe_init_pre(fl_tokenizer *t) {
    const pre_kind *k = NULL;
    const char *name = t->pre_name[0] ? t->pre_name : "default";
    for (size_t i = 0; i < sizeof PRE_KINDS / sizeof PRE_KINDS[0] && !k; i++)
        if (name_in(PRE_KINDS[i].names, name)) k = &PRE_KINDS[i];
    if (!k) return fl_set_error(FL_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer '%s' (tokenizer.ggml.pre)", name);
    t->ignore_merges = k->ignore_merges;
    t->clean_spaces = k->clean_spaces;
    if (k->add_bos) t->add_bos = true; /* tokenizer.ggml.add_bos_token, read later, still wins */
    pcre2_general_context *gctx = pcre2_general_context_create(fl_mem_malloc_ctx, fl_mem_free_ctx, NULL);
    pcre2_compile_context *cctx = gctx ? pcre2_compile_context_create(gctx) : NULL;
    if (!cctx) {
        if (gctx) pcre2_general_context_free(gctx);
        return fl_set_error(FL_ERR_NOMEM, "tokenizer: cannot create a pcre2 context");
    }
    t->pcre_gctx = gctx;
    fl_status st = FL_OK;
    for (int i = 0; i < 6 && k->regex[i] && !st; i++) {
        int err = 0;
        PCRE2_SIZE erroff = 0;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)k->regex[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &erroff, cctx);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            st = fl_set_error(FL_ERR_INTERNAL, "tokenizer: regex %d of '%s' does not compile at %zu: %s", i, name, (size_t)erroff, (char *)msg);
            break;
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
        t->regex[t->n_regex++] = re;
    }
    pcre2_compile_context_free(cctx);
    return st;
}

void fl_bpe_free_pre(fl_tokenizer *t) {
    for (int i = 0; i < t->n_regex; i++) pcre2_code_free((pcre2_code *)t->regex[i]);
    t->n_regex = 0;
    if (t->pcre_gctx) pcre2_general_context_free((pcre2_general_context *)t->pcre_gctx);
    t->pcre_gctx = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* merges                                                                                      */

typedef struct { const char *l; size_t nl; const char *r; size_t nr; } pairkey;

static bool merge_eq(const void *ctx, uint32_t rank, const void *key) {
    const fl_tokenizer *t = ctx;
    const pairkey *k = key;
    const fl_bpe_merge *m = &t->merges[rank];
    return m->l_len == k->nl && m->r_len == k->nr && memcmp(t->merge_text + m->l_off, k->l, k->nl) == 0 &&
           memcmp(t->merge_text + m->r_off, k->r, k->nr) == 0;
}

/* Rank of the merge (left, right), or -1. */
static int32_t merge_rank(const fl_tokenizer *t, const char *l, size_t nl, const char *r, size_t nr) {
    pairkey k = {l, nl, r, nr};
    return (int32_t)fl_strtab_get(&t->merge_map, fl_strtab_hash2(l, nl, r, nr), merge_eq, t, &k);
}

fl_status fl_bpe_set_merges(fl_tokenizer *t, const fl_gguf_str *lines, int64_t n) {
    if (n < 0 || n > INT32_MAX / 2) return fl_set_error(FL_ERR_FORMAT, "tokenizer: %lld merges out of range", (long long)n);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += (size_t)lines[i].len;
    if (total > UINT32_MAX / 2) return fl_set_error(FL_ERR_FORMAT, "tokenizer: merges too large");
    t->n_merges = n > 0 ? n : 1; /* at least one (zeroed) entry so the block is never empty */
    t->merges = fl_calloc(FL_MEM_MISC, (size_t)t->n_merges, sizeof(fl_bpe_merge));
    t->merge_text_size = total + 1;
    t->merge_text = fl_alloc(FL_MEM_MISC, t->merge_text_size, 0);
    if (!t->merges || !t->merge_text) return fl_set_error(FL_ERR_NOMEM, "tokenizer: cannot allocate %lld merges", (long long)n);
    fl_status st = fl_strtab_init(&t->merge_map, (uint64_t)n);
    if (st) return st;
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *s = lines[i].data;
        size_t len = (size_t)lines[i].len;
        memcpy(t->merge_text + off, s, len);
        /* split at the first space after the first byte (llama.cpp: find(' ', 1)) */
        size_t sp = 1;
        while (sp < len && s[sp] != ' ') sp++;
        fl_bpe_merge *m = &t->merges[i];
        if (sp < len) {
            *m = (fl_bpe_merge){(uint32_t)off, (uint32_t)sp, (uint32_t)(off + sp + 1), (uint32_t)(len - sp - 1)};
        } else {
            *m = (fl_bpe_merge){(uint32_t)off, 0, (uint32_t)off, 0}; /* malformed: ("", "") */
        }
        off += len;
        pairkey k = {t->merge_text + m->l_off, m->l_len, t->merge_text + m->r_off, m->r_len};
        uint64_t h = fl_strtab_hash2(k.l, k.nl, k.r, k.nr);
        if (fl_strtab_get(&t->merge_map, h, merge_eq, t, &k) < 0) /* the first rank wins */
            fl_strtab_put(&t->merge_map, h, (uint32_t)i, merge_eq, t, &k);
    }
    t->merge_text[off] = 0;
    return FL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GPT-2 bytes_to_unicode                                                                      */

/* Code point of byte b: printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) map to themselves,
 * the other 68 bytes to 256, 257, ... in byte order. */
static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) k++;
    return 256 + k;
}

typedef struct byte_map {
    char enc[256][2]; /* UTF-8 of byte_to_cp(b) (always 1 or 2 bytes) */
    unsigned char enc_len[256];
    int16_t dec[324]; /* code point -> byte, -1 if not in the map */
} byte_map;

static byte_map BYTE_MAP;
static pthread_once_t BYTE_MAP_ONCE = PTHREAD_ONCE_INIT;

static void byte_map_init(void) {
    for (int c = 0; c < 324; c++) BYTE_MAP.dec[c] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = byte_to_cp(b);
        if (cp < 0x80) {
            BYTE_MAP.enc[b][0] = (char)cp;
            BYTE_MAP.enc_len[b] = 1;
        } else {
            BYTE_MAP.enc[b][0] = (char)(0xc0 | (cp >> 6));
            BYTE_MAP.enc[b][1] = (char)(0x80 | (cp & 0x3f));
            BYTE_MAP.enc_len[b] = 2;
        }
        BYTE_MAP.dec[cp] = (int16_t)b;
    }
}

static const byte_map *bytes(void) {
    pthread_once(&BYTE_MAP_ONCE, byte_map_init);
    return &BYTE_MAP;
}

int64_t fl_bpe_decode_text(const char *s, size_t n, char *buf, int64_t cap) {
    const byte_map *bm = bytes();
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t cl = (size_t)fl_utf8_len(c);
        if (cl > n - i) cl = n - i;
        uint32_t cp = c;
        if (cl == 2) cp = ((uint32_t)(c & 0x1f) << 6) | ((unsigned char)s[i + 1] & 0x3f);
        if (cl <= 2 && cp < 324 && bm->dec[cp] >= 0) {
            if (k < cap) buf[k] = (char)bm->dec[cp];
            k++;
        } else { /* not a byte-level symbol: keep it as it is */
            for (size_t j = 0; j < cl; j++, k++)
                if (k < cap) buf[k] = s[i + j];
        }
        i += cl;
    }
    return k;
}

/* ------------------------------------------------------------------------------------------ */
/* tokenize                                                                                    */

typedef struct span {
    int64_t off, len;
} span;

typedef struct spanvec {
    span *v;
    int64_t n, cap;
} spanvec;

static fl_status span_push(spanvec *a, int64_t off, int64_t len) {
    if (len <= 0) return FL_OK;
    if (a->n == a->cap) {
        int64_t nc = a->cap ? a->cap * 2 : 64;
        span *nv = fl_realloc(FL_MEM_SCRATCH, a->v, (size_t)a->cap * sizeof(span), (size_t)nc * sizeof(span), 0);
        if (!nv) return fl_set_error(FL_ERR_NOMEM, "bpe: out of memory splitting the text");
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = (span){off, len};
    return FL_OK;
}

static void span_free(spanvec *a) {
    if (a->v) fl_free(FL_MEM_SCRATCH, a->v, (size_t)a->cap * sizeof(span));
    *a = (spanvec){0};
}

/* Split every span of `in` by regex re into matches and the gaps between them. */
static fl_status regex_split(const pcre2_code *re, pcre2_match_data *md, const char *text, const spanvec *in, spanvec *out) {
    fl_status st = FL_OK;
    out->n = 0;
    for (int64_t s = 0; s < in->n && !st; s++) {
        const PCRE2_SPTR subj = (PCRE2_SPTR)(text + in->v[s].off);
        const PCRE2_SIZE n = (PCRE2_SIZE)in->v[s].len;
        PCRE2_SIZE pos = 0, done = 0; /* search from pos; bytes before done are emitted */
        while (pos < n && !st) {
            int rc = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
                rc = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return fl_set_error(FL_ERR_INTERNAL, "bpe: pcre2 match failed: %s", (char *)msg);
            }
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            PCRE2_SIZE ms = ov[0], me = ov[1];
            if (me == ms) { /* empty match: nothing to emit, move on one character */
                pos = ms + (PCRE2_SIZE)fl_utf8_len(subj[ms < n ? ms : n - 1]);
                continue;
            }
            if (ms > done) st = span_push(out, in->v[s].off + (int64_t)done, (int64_t)(ms - done));
            if (!st) st = span_push(out, in->v[s].off + (int64_t)ms, (int64_t)(me - ms));
            done = pos = me;
        }
        if (!st && done < n) st = span_push(out, in->v[s].off + (int64_t)done, (int64_t)(n - done));
    }
    return st;
}

typedef struct bpe_sym {
    int32_t off, n, prev, next;
} bpe_sym;

typedef struct bpe_bigram {
    int32_t rank, left, right, size;
} bpe_bigram;

static bool bb_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

typedef struct bpe_work {
    char *w; /* encoded word */
    size_t w_cap;
    bpe_sym *sym;
    size_t sym_cap;
    bpe_bigram *heap;
    int64_t heap_n, heap_cap;
} bpe_work;

static fl_status heap_push(bpe_work *wk, bpe_bigram b) {
    if (wk->heap_n == wk->heap_cap) {
        int64_t nc = wk->heap_cap ? wk->heap_cap * 2 : 64;
        bpe_bigram *nv = fl_realloc(FL_MEM_SCRATCH, wk->heap, (size_t)wk->heap_cap * sizeof *nv, (size_t)nc * sizeof *nv, 0);
        if (!nv) return fl_set_error(FL_ERR_NOMEM, "bpe: out of memory");
        wk->heap = nv;
        wk->heap_cap = nc;
    }
    int64_t i = wk->heap_n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!bb_before(&b, &wk->heap[p])) break;
        wk->heap[i] = wk->heap[p];
        i = p;
    }
    wk->heap[i] = b;
    return FL_OK;
}

static bpe_bigram heap_pop(bpe_work *wk) {
    bpe_bigram top = wk->heap[0], last = wk->heap[--wk->heap_n];
    int64_t i = 0, n = wk->heap_n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bb_before(&wk->heap[c + 1], &wk->heap[c])) c++;
        if (!bb_before(&wk->heap[c], &last)) break;
        wk->heap[i] = wk->heap[c];
        i = c;
    }
    if (n > 0) wk->heap[i] = last;
    return top;
}

static fl_status try_pair(const fl_tokenizer *t, bpe_work *wk, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return FL_OK;
    const bpe_sym *a = &wk->sym[l], *b = &wk->sym[r];
    int32_t rank = merge_rank(t, wk->w + a->off, (size_t)a->n, wk->w + b->off, (size_t)b->n);
    if (rank < 0) return FL_OK;
    return heap_push(wk, (bpe_bigram){rank, l, r, a->n + b->n});
}

static fl_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return FL_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = fl_realloc(FL_MEM_SCRATCH, *p, *cap * elem, nc * elem, 0);
    if (!np) return fl_set_error(FL_ERR_NOMEM, "bpe: out of memory");
    *p = np;
    *cap = nc;
    return FL_OK;
}

/* Byte-encode one pre-tokenized word and merge it. */
static fl_status bpe_word(const fl_tokenizer *t, const byte_map *bm, bpe_work *wk, const char *word, size_t n, fl_idvec *out) {
    fl_status st = grow((void **)&wk->w, &wk->w_cap, 2 * n, 1);
    if (st) return st;
    size_t wl = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned b = (unsigned char)word[i];
        memcpy(wk->w + wl, bm->enc[b], bm->enc_len[b]);
        wl += bm->enc_len[b];
    }
    if (t->ignore_merges) {
        int32_t id = fl_tok_find(t, wk->w, wl);
        if (id >= 0) return fl_idvec_push(out, id);
    }
    if ((st = grow((void **)&wk->sym, &wk->sym_cap, wl, sizeof(bpe_sym)))) return st;
    int32_t ns = 0;
    for (size_t off = 0; off < wl;) {
        size_t cl = (size_t)fl_utf8_len((unsigned char)wk->w[off]);
        if (cl > wl - off) cl = wl - off;
        wk->sym[ns] = (bpe_sym){(int32_t)off, (int32_t)cl, ns - 1, off + cl == wl ? -1 : ns + 1};
        ns++;
        off += cl;
    }
    wk->heap_n = 0;
    for (int32_t i = 1; i < ns && !st; i++) st = try_pair(t, wk, i - 1, i);
    while (wk->heap_n > 0 && !st) {
        bpe_bigram b = heap_pop(wk);
        bpe_sym *l = &wk->sym[b.left], *r = &wk->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) wk->sym[r->next].prev = b.left;
        st = try_pair(t, wk, l->prev, b.left);
        if (!st) st = try_pair(t, wk, b.left, l->next);
    }
    for (int32_t i = 0; i != -1 && !st && ns > 0; i = wk->sym[i].next) {
        const bpe_sym *s = &wk->sym[i];
        int32_t id = fl_tok_find(t, wk->w + s->off, (size_t)s->n);
        if (id >= 0) {
            st = fl_idvec_push(out, id);
            continue;
        }
        for (int32_t k = 0; k < s->n && !st; k++) { /* llama.cpp: single-byte tokens that exist */
            int32_t bid = fl_tok_find(t, wk->w + s->off + k, 1);
            if (bid >= 0) st = fl_idvec_push(out, bid);
        }
    }
    return st;
}

fl_status fl_bpe_tokenize(const fl_tokenizer *t, const char *text, size_t len, fl_idvec *out) {
    if (len == 0) return FL_OK;
    const byte_map *bm = bytes();
    spanvec a = {0}, b = {0};
    bpe_work wk = {0};
    pcre2_match_data *md = NULL;
    fl_status st = span_push(&a, 0, (int64_t)len);
    for (int i = 0; i < t->n_regex && !st; i++) {
        const pcre2_code *re = t->regex[i];
        if (!md) md = pcre2_match_data_create_from_pattern(re, t->pcre_gctx);
        if (!md) {
            st = fl_set_error(FL_ERR_NOMEM, "bpe: cannot allocate pcre2 match data");
            break;
        }
        if ((st = regex_split(re, md, text, &a, &b))) break;
        spanvec tmp = a;
        a = b;
        b = tmp;
    }
    for (int64_t i = 0; i < a.n && !st; i++) st = bpe_word(t, bm, &wk, text + a.v[i].off, (size_t)a.v[i].len, out);
    if (md) pcre2_match_data_free(md);
    if (wk.w) fl_free(FL_MEM_SCRATCH, wk.w, wk.w_cap);
    if (wk.sym) fl_free(FL_MEM_SCRATCH, wk.sym, wk.sym_cap * sizeof(bpe_sym));
    if (wk.heap) fl_free(FL_MEM_SCRATCH, wk.heap, (size_t)wk.heap_cap * sizeof(bpe_bigram));
    span_free(&a);
    span_free(&b);
    return st;
}
