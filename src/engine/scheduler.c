/* Continuous-batching scheduler (see scheduler.h for the policy). */
#include "engine/scheduler.h"

#include "core/alloc.h"
#include "core/status.h"

#include <string.h>

typedef struct req_list {
    fl_request **v;
    int32_t n, cap;
} req_list;

struct fl_sched {
    fl_sched_params p;
    fl_sched_kv kv;
    req_list waiting; /* in scheduling order (precedes(); preempted requests keep their rank) */
    req_list running; /* in scheduling order */
    fl_sched_entry *e;
    int32_t e_cap;
    fl_sched_stats st;
};

#define LIST_CAP0 16 /* a list's first capacity; it doubles */

static fl_status list_reserve(req_list *l, int32_t n) {
    if (n <= l->cap) return FL_OK;
    const int32_t nc = (int32_t)fl_cap_double(l->cap ? l->cap : LIST_CAP0, n);
    fl_request **v = fl_realloc(FL_MEM_MISC, l->v, (size_t)l->cap * sizeof *v, (size_t)nc * sizeof *v, 0);
    if (!v) return FL_ERR_NOMEM;
    l->v = v;
    l->cap = nc;
    return FL_OK;
}

/* Does a come before b in the scheduling order: by arrival (FCFS), or by priority, lower first,
 * then arrival (FL_SCHED_PRIORITY)?  Arrivals are unique, so this is a total order. */
static bool precedes(fl_sched_policy policy, const fl_request *a, const fl_request *b) {
    if (policy == FL_SCHED_PRIORITY && a->priority != b->priority) return a->priority < b->priority;
    return a->arrival < b->arrival;
}

/* Insert keeping the list in scheduling order. */
static fl_status list_insert(req_list *l, fl_sched_policy policy, fl_request *r) {
    fl_status st = list_reserve(l, l->n + 1);
    if (st != FL_OK) return st;
    int32_t i = l->n;
    while (i > 0 && precedes(policy, r, l->v[i - 1])) i--;
    memmove(l->v + i + 1, l->v + i, (size_t)(l->n - i) * sizeof *l->v);
    l->v[i] = r;
    l->n++;
    return FL_OK;
}

static bool list_remove(req_list *l, const fl_request *r) {
    for (int32_t i = 0; i < l->n; i++)
        if (l->v[i] == r) {
            memmove(l->v + i, l->v + i + 1, (size_t)(l->n - i - 1) * sizeof *l->v);
            l->n--;
            return true;
        }
    return false;
}

static void list_free(req_list *l) {
    fl_free(FL_MEM_MISC, l->v, (size_t)l->cap * sizeof *l->v);
    memset(l, 0, sizeof *l);
}

size_t fl_sched_misc_bytes(int32_t max_seqs, int32_t n_waiting) {
    return sizeof(fl_sched) + sizeof(fl_sched_entry) * (size_t)max_seqs +
           sizeof(fl_request *) * (size_t)(fl_cap_double(LIST_CAP0, n_waiting) + fl_cap_double(LIST_CAP0, max_seqs));
}

fl_status fl_sched_new(const fl_sched_params *p, const fl_sched_kv *kv, fl_sched **out) {
    *out = NULL;
    if (p->max_seqs < 1 || p->max_batch_tokens < 1 || p->watermark_blocks < 0)
        return fl_set_error(FL_ERR_INVALID, "%s: max_seqs (%d) and max_batch_tokens (%d) must be >= 1",
                            __func__, p->max_seqs, p->max_batch_tokens);
    if (p->policy != FL_SCHED_FCFS && p->policy != FL_SCHED_PRIORITY)
        return fl_set_error(FL_ERR_INVALID, "%s: unknown scheduling policy %d", __func__, (int)p->policy);
    if (!kv->n_free || !kv->seq_begin || !kv->n_needed || !kv->reserve || !kv->seq_end)
        return fl_set_error(FL_ERR_INVALID, "%s: KV callbacks missing", __func__);
    fl_sched *s = fl_calloc(FL_MEM_MISC, 1, sizeof *s);
    if (!s) return FL_ERR_NOMEM;
    s->p = *p;
    if (s->p.max_rows < 1) s->p.max_rows = p->max_seqs;
    s->kv = *kv;
    /* at most one entry per running request + padding rows (bounded by max_seqs too) */
    s->e_cap = p->max_seqs;
    s->e = fl_calloc(FL_MEM_MISC, (size_t)s->e_cap, sizeof *s->e);
    if (!s->e || list_reserve(&s->waiting, LIST_CAP0) != FL_OK || list_reserve(&s->running, p->max_seqs) != FL_OK) {
        fl_sched_free(s);
        return FL_ERR_NOMEM;
    }
    *out = s;
    return FL_OK;
}

void fl_sched_free(fl_sched *s) {
    if (!s) return;
    list_free(&s->waiting);
    list_free(&s->running);
    if (s->e) fl_free(FL_MEM_MISC, s->e, (size_t)s->e_cap * sizeof *s->e);
    fl_free(FL_MEM_MISC, s, sizeof *s);
}

fl_status fl_sched_add(fl_sched *s, fl_request *r) {
    FL_ASSERT(r->state == FL_REQ_WAITING && !r->in_sched);
    fl_status st = list_insert(&s->waiting, s->p.policy, r);
    if (st == FL_OK) r->in_sched = true;
    return st;
}

static void release_kv(fl_sched *s, fl_request *r) {
    if (r->kv_live) s->kv.seq_end(s->kv.ctx, r);
    r->kv_live = false;
    r->swapped = false;
}

/* Static mode: once no real member of the batch is left, drop the padding rows. */
static void drop_padding_if_batch_done(fl_sched *s) {
    for (int32_t i = 0; i < s->running.n; i++)
        if (!s->running.v[i]->padding) return;
    for (int32_t i = 0; i < s->running.n; i++) {
        fl_request *r = s->running.v[i];
        release_kv(s, r);
        r->in_sched = false;
        r->padding = false;
    }
    s->running.n = 0;
}

void fl_sched_remove(fl_sched *s, fl_request *r, bool keep_as_padding) {
    if (!r->in_sched) return;
    if (keep_as_padding && s->p.static_batch && r->state == FL_REQ_FINISHED && list_remove(&s->running, r)) {
        /* re-insert as a padding row: it keeps its slot and runs dummy tokens until the batch ends */
        r->padding = true;
        list_insert(&s->running, s->p.policy, r); /* cannot fail: capacity was there a moment ago */
        drop_padding_if_batch_done(s);
        return;
    }
    bool was_running = list_remove(&s->running, r);
    if (!was_running) list_remove(&s->waiting, r);
    release_kv(s, r);
    r->in_sched = false;
    /* only a running request can end a batch (removing a waiting one may happen from another
     * thread during a forward, which must not touch the rows being computed) */
    if (s->p.static_batch && was_running) drop_padding_if_batch_done(s);
}

/* Preempt the running request v: swap its blocks out (swap mode) or free them (recompute),
 * and put it back into the waiting queue at its rank. */
static void preempt(fl_sched *s, fl_request *v, fl_sched_out *out) {
    list_remove(&s->running, v);
    bool swapped = false;
    if (s->p.preempt == FL_PREEMPT_SWAP && s->kv.swap_out && v->n_computed > 0 && v->kv_live) {
        if (s->kv.swap_out(s->kv.ctx, v) == FL_OK) {
            swapped = true;
            s->st.swaps_out++;
            out->n_swapped_out++;
        }
    }
    if (!swapped) {
        release_kv(s, v);
        v->n_computed = 0;
    }
    v->swapped = swapped;
    v->state = FL_REQ_PREEMPTED;
    v->n_preempted++;
    s->st.preemptions++;
    out->n_preempted++;
    list_insert(&s->waiting, s->p.policy, v); /* cannot fail: waiting has room (it held v's slot before) */
}

static int32_t find_entry(const fl_sched_out *out, const fl_request *r) {
    for (int32_t i = 0; i < out->n_entries; i++)
        if (out->e[i].r == r) return i;
    return -1;
}

static void drop_entry(fl_sched_out *out, int32_t i) {
    out->n_tokens -= out->e[i].n;
    memmove(out->e + i, out->e + i + 1, (size_t)(out->n_entries - i - 1) * sizeof *out->e);
    out->n_entries--;
}

/* The running request that goes first when one must: the last in scheduling order (the latest
 * arrival; under FL_SCHED_PRIORITY the latest of the lowest priority).  NULL if none. */
static fl_request *last_running(const fl_sched *s) {
    for (int32_t i = s->running.n - 1; i >= 0; i--)
        if (!s->running.v[i]->padding) return s->running.v[i];
    return NULL;
}

/* Preempt v, dropping its entry from the step if it has one. */
static void preempt_scheduled(fl_sched *s, fl_request *v, fl_sched_out *out) {
    int32_t ei = find_entry(out, v);
    if (ei >= 0) drop_entry(out, ei);
    preempt(s, v, out);
}

/* Grow r to n_total tokens, preempting running requests from the back of the scheduling order
 * until it fits.  Returns false when r itself had to be preempted. */
static bool grow_or_preempt(fl_sched *s, fl_request *r, int32_t n_total, fl_sched_out *out) {
    while (s->kv.reserve(s->kv.ctx, r, n_total) == FL_NO_KV_SPACE) {
        fl_request *victim = last_running(s);
        if (!victim) return false;
        preempt_scheduled(s, victim, out);
        if (victim == r) return false;
    }
    return true;
}

/* Logits rows an entry of n tokens from r->n_computed needs: the sampling row when it reaches the
 * last token, and with prompt logprobs one per prompt position not yet recorded whose next token
 * is in the prompt. */
static int32_t rows_for(const fl_request *r, int32_t n) {
    const int32_t c = r->n_computed;
    int32_t rows = c + n == r->n_tokens;
    if (r->prompt_logprobs) {
        const int32_t lo = c > r->n_plp ? c : r->n_plp, hi = c + n < r->n_prompt - 1 ? c + n : r->n_prompt - 1;
        rows += hi > lo ? hi - lo : 0;
    }
    return rows;
}

/* Rows of the step's entries so far (a draft token's row each). */
static int32_t rows_used(const fl_sched_out *out) {
    int32_t rows = 0;
    for (int32_t i = 0; i < out->n_entries; i++)
        if (!out->e[i].pad) rows += rows_for(out->e[i].r, out->e[i].n - out->e[i].spec) + out->e[i].spec;
    return rows;
}

/* The most tokens, up to n, that r can run with the step's rows left (max_rows in all): rows_for
 * grows with n, so a binary search. */
static int32_t fit_rows(const fl_sched *s, const fl_sched_out *out, const fl_request *r, int32_t n) {
    const int32_t left = s->p.max_rows - rows_used(out);
    if (rows_for(r, n) <= left) return n;
    int32_t lo = 0, hi = n; /* rows_for(lo) <= left < rows_for(hi) */
    while (hi - lo > 1) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (rows_for(r, mid) <= left) lo = mid;
        else hi = mid;
    }
    return lo;
}

static void add_entry(fl_sched_out *out, fl_request *r, int32_t n, int32_t pad) {
    out->e[out->n_entries++] = (fl_sched_entry){r, n, pad, 0};
    out->n_tokens += n;
}

/* What admit_one did: admitted r, or not now, either for want of KV (blocks, a sequence slot;
 * running requests of lower priority may make room) or for another reason (r waits for its fork
 * parent, no logits row is left this step, a hard error in *err). */
typedef enum { ADMITTED, ADMIT_WAIT, ADMIT_NO_KV } admit_result;

/* Admit the head of the waiting queue if its first chunk fits. */
static admit_result admit_one(fl_sched *s, fl_request *r, int32_t budget, fl_sched_out *out, fl_status *err) {
    /* the watermark keeps room for running requests to grow; with none running it only could
     * stall a request that grew past pool - watermark before being swapped out */
    int64_t avail = s->kv.n_free(s->kv.ctx) - (s->running.n > 0 ? s->p.watermark_blocks : 0);
    fl_request *parent = r->fork_parent;
    if (parent && parent->state != FL_REQ_FINISHED) {
        /* n > 1: wait for sample 0's prompt, then share its blocks */
        if (parent->state != FL_REQ_RUNNING || parent->n_computed < parent->n_prompt) return ADMIT_WAIT;
    }
    if (r->swapped) {
        int32_t n = fit_rows(s, out, r, fl_request_n_uncomputed(r) < budget ? fl_request_n_uncomputed(r) : budget);
        if (n == 0) return ADMIT_WAIT; /* no logits row left this step */
        if (s->kv.n_needed(s->kv.ctx, r, r->n_computed + n) > avail) return ADMIT_NO_KV;
        if (s->kv.swap_in(s->kv.ctx, r) != FL_OK) return ADMIT_WAIT;
        r->swapped = false;
        s->st.swaps_in++;
        out->n_swapped_in++;
        if (s->kv.reserve(s->kv.ctx, r, r->n_computed + n) != FL_OK) {
            /* swapped in but cannot grow: fall back to recompute later */
            release_kv(s, r);
            r->n_computed = 0;
            return ADMIT_WAIT;
        }
        list_remove(&s->waiting, r);
        list_insert(&s->running, s->p.policy, r);
        r->state = FL_REQ_RUNNING;
        add_entry(out, r, n, 0);
        return ADMITTED;
    }
    FL_ASSERT(!r->kv_live && r->n_computed == 0);
    int32_t n_cached = 0;
    fl_status st = s->kv.seq_begin(s->kv.ctx, r, &n_cached); /* a sample that could not be forked
                                                                * shares full blocks via the prefix cache */
    if (st == FL_NO_KV_SPACE) return ADMIT_NO_KV; /* no sequence id / slot free now */
    if (st != FL_OK) {
        *err = st;
        return ADMIT_WAIT;
    }
    r->kv_live = true;
    FL_ASSERT(n_cached >= 0 && n_cached < r->n_tokens);
    r->n_computed = n_cached;
    int32_t n = fit_rows(s, out, r, fl_request_n_uncomputed(r) < budget ? fl_request_n_uncomputed(r) : budget);
    /* static mode reserves the whole slot up front even when no token fits this step */
    const bool no_row = n == 0 && !s->p.static_batch;
    if (no_row || s->kv.n_needed(s->kv.ctx, r, r->n_computed + (n ? n : 1)) > avail ||
        s->kv.reserve(s->kv.ctx, r, r->n_computed + (n ? n : 1)) != FL_OK) {
        release_kv(s, r);
        r->n_computed = 0;
        return no_row ? ADMIT_WAIT : ADMIT_NO_KV;
    }
    if (r->n_preempted == 0 && r->n_cached_prompt == 0) {
        r->n_cached_prompt = n_cached;
        s->st.prefix_hit_tokens += n_cached;
        s->st.prefix_miss_tokens += r->n_prompt - n_cached;
    }
    list_remove(&s->waiting, r);
    list_insert(&s->running, s->p.policy, r);
    r->state = FL_REQ_RUNNING;
    s->st.admissions++;
    out->n_admitted++;
    if (n > 0) add_entry(out, r, n, 0);
    return ADMITTED;
}

/* FL_SCHED_PRIORITY: r, the head of the waiting queue, lacks KV or a slot; preempt the last
 * running request if r's priority is strictly higher (lower value), so that r can take its place.
 * Strictly: a preempted request never outranks the ones still running, so none comes back to
 * preempt its preemptor.  False when there is nothing to do. */
static bool make_room(fl_sched *s, const fl_request *r, fl_sched_out *out) {
    if (s->p.policy != FL_SCHED_PRIORITY || s->p.static_batch) return false;
    fl_request *v = last_running(s);
    if (!v || v->priority <= r->priority) return false;
    preempt_scheduled(s, v, out);
    return true;
}

/* Pass 4: the decodes' draft tokens, in scheduling order, where the token budget, the rows and
 * the free blocks left by everything else allow (fewer drafts when that is what fits; never a
 * preemption, never at the expense of a prefill or an admission). */
static void add_drafts(fl_sched *s, fl_sched_out *out, int32_t *budget) {
    if (!s->kv.truncate || s->p.static_batch) return;
    int32_t rows_left = s->p.max_rows - rows_used(out);
    for (int32_t i = 0; i < out->n_entries && *budget > 0 && rows_left > 0; i++) {
        fl_sched_entry *en = &out->e[i];
        fl_request *r = en->r;
        if (en->pad || r->n_draft < 1 || en->n != 1 || r->n_computed + 1 != r->n_tokens) continue;
        int32_t d = r->n_draft;
        if (d > *budget) d = *budget;
        if (d > rows_left) d = rows_left;
        const int64_t avail = s->kv.n_free(s->kv.ctx) - s->p.watermark_blocks; /* (admissions keep it too) */
        while (d > 0 && (s->kv.n_needed(s->kv.ctx, r, r->n_computed + 1 + d) > avail ||
                         s->kv.reserve(s->kv.ctx, r, r->n_computed + 1 + d) != FL_OK))
            d--;
        en->n += d;
        en->spec = d;
        out->n_tokens += d;
        *budget -= d;
        rows_left -= d;
    }
}

fl_status fl_sched_schedule(fl_sched *s, fl_sched_out *out) {
    memset(out, 0, sizeof *out);
    out->e = s->e;
    int32_t budget = s->p.max_batch_tokens;
    bool batch_empty = s->running.n == 0;

    /* passes 1 and 2: decodes first (and padding rows), then prefill chunks */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < s->running.n && budget > 0; i++) {
            fl_request *r = s->running.v[i];
            if (find_entry(out, r) >= 0) continue;
            if (r->padding) {
                if (pass == 0 && s->kv.reserve(s->kv.ctx, r, r->n_computed + 1) == FL_OK) {
                    add_entry(out, r, 1, 1);
                    budget--;
                }
                continue;
            }
            int32_t left = fl_request_n_uncomputed(r);
            if ((pass == 0) != (left == 1)) continue;
            int32_t n = fit_rows(s, out, r, left < budget ? left : budget);
            if (n == 0) continue; /* the step's logits rows are taken (prompt logprobs) */
            if (!grow_or_preempt(s, r, r->n_computed + n, out)) {
                budget = s->p.max_batch_tokens - out->n_tokens;
                i = -1; /* the running list changed: rescan (scheduled ones are skipped) */
                continue;
            }
            add_entry(out, r, n, 0);
            budget -= n;
        }
    }

    /* pass 3: admissions in scheduling order, not in a step that preempted to grow; under
     * FL_SCHED_PRIORITY a request may preempt running ones of lower priority to get in */
    fl_status err = FL_OK;
    bool may_admit = out->n_preempted == 0 && (!s->p.static_batch || batch_empty);
    while (may_admit && s->waiting.n > 0 && (budget > 0 || s->p.static_batch)) {
        fl_request *r = s->waiting.v[0];
        const admit_result a = s->running.n < s->p.max_seqs ? admit_one(s, r, budget, out, &err) : ADMIT_NO_KV;
        if (a != ADMITTED && (a != ADMIT_NO_KV || err != FL_OK || !make_room(s, r, out))) break;
        budget = s->p.max_batch_tokens - out->n_tokens;
    }
    if (err != FL_OK) return err;
    add_drafts(s, out, &budget); /* with what is left */
    if (s->running.n > s->st.max_running) s->st.max_running = s->running.n;
    s->st.steps++;
    return FL_OK;
}

void fl_sched_commit(fl_sched *s, const fl_sched_out *out) {
    (void)s;
    for (int32_t i = 0; i < out->n_entries; i++) {
        fl_request *r = out->e[i].r;
        r->n_computed += out->e[i].n - out->e[i].spec;
        FL_ASSERT(r->padding || r->n_computed <= r->n_tokens);
    }
}

int32_t fl_sched_n_waiting(const fl_sched *s) { return s->waiting.n; }
int32_t fl_sched_n_running(const fl_sched *s) { return s->running.n; }
int32_t fl_sched_n_preempted(const fl_sched *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->waiting.n; i++) n += s->waiting.v[i]->state == FL_REQ_PREEMPTED;
    return n;
}
fl_request *fl_sched_running_at(const fl_sched *s, int32_t i) { return i >= 0 && i < s->running.n ? s->running.v[i] : NULL; }
fl_request *fl_sched_waiting_at(const fl_sched *s, int32_t i) { return i >= 0 && i < s->waiting.n ? s->waiting.v[i] : NULL; }
void fl_sched_stats_get(const fl_sched *s, fl_sched_stats *st) { *st = s->st; }

fl_status fl_sched_check(const fl_sched *s) {
    if (s->running.n > s->p.max_seqs)
        return fl_set_error(FL_ERR_INTERNAL, "%s: %d running > max_seqs %d", __func__, s->running.n, s->p.max_seqs);
    for (int32_t i = 0; i < s->running.n; i++) {
        const fl_request *r = s->running.v[i];
        if (!r->kv_live || !r->in_sched || r->swapped)
            return fl_set_error(FL_ERR_INTERNAL, "%s: running request %lld holds no KV", __func__, (long long)r->id);
        if (!r->padding && r->state != FL_REQ_RUNNING)
            return fl_set_error(FL_ERR_INTERNAL, "%s: request %lld in running list is %s", __func__,
                                (long long)r->id, fl_request_state_name(r->state));
        if (i > 0 && !precedes(s->p.policy, s->running.v[i - 1], r))
            return fl_set_error(FL_ERR_INTERNAL, "%s: running list out of order", __func__);
    }
    for (int32_t i = 0; i < s->waiting.n; i++) {
        const fl_request *r = s->waiting.v[i];
        if (r->state != FL_REQ_WAITING && r->state != FL_REQ_PREEMPTED)
            return fl_set_error(FL_ERR_INTERNAL, "%s: waiting request %lld is %s", __func__, (long long)r->id,
                                fl_request_state_name(r->state));
        if (r->kv_live != r->swapped)
            return fl_set_error(FL_ERR_INTERNAL, "%s: waiting request %lld holds KV without being swapped",
                                __func__, (long long)r->id);
        if (!r->swapped && r->n_computed != 0)
            return fl_set_error(FL_ERR_INTERNAL, "%s: waiting request %lld has computed tokens", __func__, (long long)r->id);
        if (i > 0 && !precedes(s->p.policy, s->waiting.v[i - 1], r))
            return fl_set_error(FL_ERR_INTERNAL, "%s: waiting queue out of order", __func__);
    }
    return FL_OK;
}

fl_status fl_sched_admit_fork(fl_sched *s, fl_request *parent, fl_request *child) {
    if (!s->kv.fork || s->running.n >= s->p.max_seqs || child->state != FL_REQ_WAITING || child->kv_live ||
        !parent->kv_live || parent->n_computed != child->n_tokens)
        return FL_NO_KV_SPACE;
    fl_status st = s->kv.fork(s->kv.ctx, parent, child, parent->n_computed);
    if (st != FL_OK) return st;
    child->kv_live = true;
    child->n_computed = parent->n_computed;
    child->n_cached_prompt = child->n_prompt;
    list_remove(&s->waiting, child);
    list_insert(&s->running, s->p.policy, child); /* capacity: running < max_seqs <= cap */
    child->state = FL_REQ_RUNNING;
    s->st.admissions++;
    return FL_OK;
}
