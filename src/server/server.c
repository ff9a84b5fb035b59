/* Server lifecycle: the libmicrohttpd daemon, the engine driver thread, graceful stop. */
#include "server/server_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/status.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void fl_server_params_default(fl_server_params *p) {
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->max_body_bytes = 1 << 20;
    p->max_tokens_limit = 4096;
    p->max_connections = 256;
    p->max_queue = 256;
    p->max_n = 8;
    p->reasoning_format = 1;
    p->responses_mem = (int64_t)16 << 20;
}

/* Route one engine output to its waiting connection (s->mu held). */
void srv_cancel(fl_server *s, srv_req *r) {
    for (int32_t k = 0; k < r->n_pr; k++) fl_engine_cancel(s->engine, r->pr[k].id);
}

/* An output of an embedding request: its vector, or why it has none (s->mu held). */
static bool dispatch_embd(fl_server *s, const fl_request_output *o) {
    for (srv_embd **pp = &s->embds; *pp; pp = &(*pp)->next) {
        srv_embd *m = *pp;
        int32_t i = 0;
        while (i < m->n && m->ids[i] != o->request_id) i++;
        if (i == m->n) continue;
        if (o->finish == FL_FINISH_NONE) return true;
        if (o->embedding && o->n_embd == m->n_embd) memcpy(m->vec + (size_t)i * (size_t)m->n_embd, o->embedding, (size_t)m->n_embd * sizeof *m->vec);
        else if (!m->failed) {
            m->failed = true;
            snprintf(m->error, sizeof m->error, "input %d ended without its embedding%s%s", i, o->error ? ": " : "", o->error ? o->error : "");
        }
        s->m.finished[o->finish == FL_FINISH_STOP ? SRV_FINISHED_STOP : o->finish == FL_FINISH_CANCELLED ? SRV_FINISHED_ABORT : SRV_FINISHED_ERROR]++;
        s->m.prompt_tokens += o->n_prompt;
        if (++m->n_done == m->n) { /* all of them: unlinked, the connection's thread answers */
            *pp = m->next;
            s->n_live--;
            s->m.requests_ok++;
        }
        pthread_cond_broadcast(&m->cv);
        return true;
    }
    return false;
}

static void dispatch(fl_server *s, const fl_request_output *o) {
    if (s->embds && dispatch_embd(s, o)) return;
    srv_req *r = s->reqs;
    int32_t k = -1;
    for (; r; r = r->next) {
        for (int32_t i = 0; i < r->n_pr && k < 0; i++)
            if (r->pr[i].id == o->request_id) k = i;
        if (k >= 0) break;
    }
    if (!r || o->sample < 0 || o->sample >= r->n) return; /* cancelled meanwhile */
    srv_prompt *pr = &r->pr[k];
    srv_sample *sm = &r->samples[k * r->n + o->sample];
    if (o->sample == 0) pr->n_cached = o->n_cached_prompt;
    if (((r->echo && r->logprobs) || r->k_plp >= 0) && !pr->plp_got && o->sample == 0) { /* the prompt's records, as they come */
        const size_t rec = (size_t)(1 + r->n_top) * sizeof *pr->plp, nr = o->n_prompt > 1 ? (size_t)(o->n_prompt - 1) : 0;
        if (nr && !r->out_failed && ((!pr->plp && !(pr->plp = fl_alloc(FL_MEM_NET, nr * rec, 8))) ||
                                    (r->k_plp >= 0 && !pr->plp_rank && !(pr->plp_rank = fl_alloc(FL_MEM_NET, nr * sizeof *pr->plp_rank, 8))))) {
            r->out_failed = true; /* a reply without them would be wrong: end it as an error */
            srv_cancel(s, r);
        }
        if (pr->plp && o->prompt_logprobs && o->prompt_logprobs_from + o->n_prompt_logprobs <= o->n_prompt - 1) {
            memcpy((char *)pr->plp + (size_t)o->prompt_logprobs_from * rec, o->prompt_logprobs, (size_t)o->n_prompt_logprobs * rec);
            if (pr->plp_rank)
                memcpy(pr->plp_rank + o->prompt_logprobs_from, o->prompt_ranks, (size_t)o->n_prompt_logprobs * sizeof *pr->plp_rank);
            pr->n_plp = o->prompt_logprobs_from + o->n_prompt_logprobs;
        }
        pr->plp_got = pr->n_plp == o->n_prompt - 1 || o->n_prompt <= 1;
    }
    fl_request_output bare;
    if (r->drop_gen) { /* echo with max_tokens 0: only the prompt is reported */
        bare = (fl_request_output){.request_id = o->request_id, .sample = o->sample, .n_prompt = o->n_prompt,
                                   .finish = o->finish == FL_FINISH_NONE ? FL_FINISH_NONE : FL_FINISH_LENGTH};
        o = &bare;
    }
    if (r->logprobs && o->new_logprobs && o->n_new > 0 && !r->out_failed) {
        const size_t rec = (size_t)(1 + r->n_top) * sizeof *sm->lp;
        if (sm->n_lp + o->n_new > sm->cap_lp) {
            int32_t cap = sm->cap_lp ? sm->cap_lp : 32;
            while (cap < sm->n_lp + o->n_new) cap *= 2;
            fl_token_logprob *p = fl_realloc(FL_MEM_NET, sm->lp, (size_t)sm->cap_lp * rec, (size_t)cap * rec, 8);
            if (p) { sm->lp = p; sm->cap_lp = cap; }
        }
        if (sm->n_lp + o->n_new <= sm->cap_lp) {
            memcpy((char *)sm->lp + (size_t)sm->n_lp * rec, o->new_logprobs, (size_t)o->n_new * rec);
            sm->n_lp += o->n_new;
        } else { /* a reply without some of its logprobs would be wrong: end it as an error */
            r->out_failed = true;
            srv_cancel(s, r);
        }
    }
    if (r->native && o->n_new > 0 && !r->out_failed) { /* /completion lists the ids */
        if (sm->n_toks + o->n_new > sm->cap_toks) {
            int32_t cap = sm->cap_toks ? sm->cap_toks : 64;
            while (cap < sm->n_toks + o->n_new) cap *= 2;
            int32_t *p = fl_realloc(FL_MEM_NET, sm->toks, (size_t)sm->cap_toks * sizeof *p, (size_t)cap * sizeof *p, 8);
            if (p) { sm->toks = p; sm->cap_toks = cap; }
        }
        if (sm->n_toks + o->n_new <= sm->cap_toks) {
            memcpy(sm->toks + sm->n_toks, o->new_tokens, (size_t)o->n_new * sizeof *sm->toks);
            sm->n_toks += o->n_new;
        } else { /* a reply without some of its ids would be wrong: end it as an error */
            r->out_failed = true;
            srv_cancel(s, r);
        }
    }
    if (o->new_text && *o->new_text && !r->out_failed) {
        if (srv_buf_append(&sm->text, o->new_text, strlen(o->new_text))) { /* a reply a piece short would be wrong */
            r->out_failed = true;
            srv_cancel(s, r);
        }
        if (sm->n_seg == sm->cap_seg) { /* remember the boundary: streaming sends one chunk per output */
            int32_t cap = sm->cap_seg ? sm->cap_seg * 2 : 32;
            srv_seg *p = fl_realloc(FL_MEM_NET, sm->seg, (size_t)sm->cap_seg * sizeof *p, (size_t)cap * sizeof *p, 8);
            if (p) { sm->seg = p; sm->cap_seg = cap; }
        }
        if (sm->n_seg < sm->cap_seg) sm->seg[sm->n_seg++] = (srv_seg){sm->text.len, sm->n_lp};
    }
    if (r->reasoning && !sm->reason_over && o->n_new > 0) { /* count the thinking's tokens while it lasts */
        size_t r0, r1, c;
        const srv_think th = srv_think_scan(sm->text.p ? sm->text.p : "", sm->text.len, r->think_open, false, sm->reason_from, &r0, &r1, &c);
        if (th == SRV_THINK_NONE) {
            sm->n_reason = 0;
            sm->reason_over = true;
        } else {
            sm->n_reason += o->n_new;
            sm->reason_over = th == SRV_THINK_DONE;
            if (th == SRV_THINK_IN) sm->reason_from = r1;
        }
    }
    sm->n_tokens = o->n_generated;
    pr->n_prompt = o->n_prompt;
    if (o->n_new > 0 && r->t_first == 0) {
        r->t_first = srv_now();
        srv_hist_add(&s->m.ttft, r->t_first - r->t_start);
    }
    if (o->finish != FL_FINISH_NONE && sm->finish == FL_FINISH_NONE) {
        sm->finish = r->out_failed && o->finish == FL_FINISH_CANCELLED ? FL_FINISH_ERROR : o->finish;
        if (o->finish == FL_FINISH_ERROR && o->error) snprintf(sm->error, sizeof sm->error, "%s", o->error);
        sm->stop_token = o->stop_token;
        if (o->stop_str && !(sm->stop_str = fl_strdup(FL_MEM_NET, o->stop_str))) { /* (stop_reason would read null) */
            r->out_failed = true;
            sm->finish = FL_FINISH_ERROR;
        }
        if (sm->finish == FL_FINISH_ERROR && r->out_failed) snprintf(sm->error, sizeof sm->error, "no memory for the text, logprobs, token ids or stop string of the reply");
        r->n_done++;
        s->m.finished[sm->finish == FL_FINISH_LENGTH      ? SRV_FINISHED_LENGTH
                      : sm->finish == FL_FINISH_CANCELLED ? SRV_FINISHED_ABORT
                      : sm->finish == FL_FINISH_ERROR     ? SRV_FINISHED_ERROR
                                                          : SRV_FINISHED_STOP]++;
        s->m.completion_tokens += o->n_generated;
        if (r->n_done == srv_choices(r)) {
            r->t_end = srv_now();
            srv_hist_add(&s->m.e2e, r->t_end - r->t_start);
            s->m.prompt_tokens += srv_prompt_tokens(r);
            s->m.requests_ok++;
            r->registered = false; /* no more outputs: unlink */
            for (srv_req **pp = &s->reqs; *pp; pp = &(*pp)->next)
                if (*pp == r) { *pp = r->next; break; }
            s->n_live--;
        }
    }
    pthread_cond_broadcast(&r->cv);
}

static void *driver_main(void *arg) {
    fl_server *s = arg;
    fl_request_output outs[64];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->n_live == 0 && s->engine_active == 0) pthread_cond_wait(&s->work_cv, &s->mu);
        bool stop = s->stopping && s->n_live == 0 && s->engine_active == 0;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        int32_t active = 0;
        fl_status st = fl_engine_step(s->engine, &active);
        if (st < 0) FL_LOG_ERROR("%s: engine step failed: %s", __func__, fl_last_error());
        int32_t n;
        while ((n = fl_engine_poll(s->engine, outs, 64)) > 0) {
            pthread_mutex_lock(&s->mu);
            for (int32_t i = 0; i < n; i++) dispatch(s, &outs[i]);
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_lock(&s->mu);
        s->engine_active = active;
        pthread_mutex_unlock(&s->mu);
        if (st < 0 && active) { /* avoid a hot loop on a persistent error */
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

/* a PEM file's text, NUL-terminated (NET) */
static fl_status read_pem(const char *path, const char *what, char **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return fl_set_error(FL_ERR_IO, "cannot read the HTTPS %s '%s': %s", what, path, strerror(errno));
    char *b = NULL;
    size_t len = 0, cap = 0;
    fl_status st = FL_OK;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            const size_t nc = cap ? cap * 2 : 8192;
            if (nc > ((size_t)1 << 20)) { st = fl_set_error(FL_ERR_INVALID, "the HTTPS %s '%s' is over 1 MiB: not a PEM file", what, path); break; }
            char *p = fl_realloc(FL_MEM_NET, b, cap, nc, 16);
            if (!p) { st = FL_ERR_NOMEM; break; }
            b = p;
            cap = nc;
        }
        const size_t r = fread(b + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    if (st == FL_OK && ferror(f)) st = fl_set_error(FL_ERR_IO, "cannot read the HTTPS %s '%s'", what, path);
    fclose(f);
    if (b) b[len] = 0; /* (cap > len: room for it was kept) */
    if (st == FL_OK && (!b || !strstr(b, "-----BEGIN ")))
        st = fl_set_error(FL_ERR_FORMAT, "the HTTPS %s '%s' is not a PEM file (no -----BEGIN line)", what, path);
    else if (st == FL_OK && !strstr(b, !strcmp(what, "key") ? "PRIVATE KEY-----" : "-----BEGIN CERTIFICATE-----"))
        st = fl_set_error(FL_ERR_FORMAT, "the HTTPS %s '%s' holds no %s (PEM)", what, path, !strcmp(what, "key") ? "private key" : "certificate");
    if (st != FL_OK) {
        fl_free(FL_MEM_NET, b, cap);
        return st;
    }
    *out = b;
    *n = cap;
    return FL_OK;
}

static void free_tls(fl_server *s) {
    if (s->tls_key) { /* (the key's bytes wiped before they go back) */
        volatile char *k = s->tls_key;
        for (size_t i = 0; i < s->tls_key_n; i++) k[i] = 0;
    }
    fl_free(FL_MEM_NET, s->tls_key, s->tls_key_n);
    fl_free(FL_MEM_NET, s->tls_cert, s->tls_cert_n);
    s->tls_key = s->tls_cert = NULL;
}

fl_status fl_server_start(fl_engine *e, const fl_server_params *p, fl_server **out) {
    *out = NULL;
    fl_server *s = fl_calloc(FL_MEM_NET, 1, sizeof *s);
    if (!s) return FL_ERR_NOMEM;
    s->engine = e;
    s->p = *p;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (s->p.max_body_bytes <= 0) s->p.max_body_bytes = 1 << 20;
    if (s->p.max_tokens_limit <= 0) s->p.max_tokens_limit = 4096;
    if (s->p.max_connections <= 0) s->p.max_connections = 256;
    if (s->p.max_queue <= 0) s->p.max_queue = 256;
    if (s->p.max_n <= 0 || s->p.max_n > SRV_MAX_N) s->p.max_n = s->p.max_n > SRV_MAX_N ? SRV_MAX_N : 8;
    snprintf(s->model_name, sizeof s->model_name, "%s", p->model_name ? p->model_name : fl_engine_model_name(e));
    if (p->api_key) snprintf(s->api_key, sizeof s->api_key, "%s", p->api_key);
    const int32_t n_loras = fl_engine_n_loras(e);
    if (p->n_lora_names < 0 || p->n_lora_names > FL_ENGINE_MAX_LORAS || (p->n_lora_names && !p->lora_names) ||
        p->n_lora_names > n_loras) {
        fl_free(FL_MEM_NET, s, sizeof *s);
        return fl_set_error(FL_ERR_INVALID, "%d adapter names: the engine has %d adapters", p->n_lora_names, n_loras);
    }
    for (int32_t i = 0; i < n_loras; i++) {
        const float v = p->lora_scales ? p->lora_scales[i] : 0.0f;
        if (!isfinite(v) || fabsf(v) > 1e6f) {
            fl_free(FL_MEM_NET, s, sizeof *s);
            return fl_set_error(FL_ERR_INVALID, "adapter %d: scale %g (finite, |scale| <= 1e6)", i, (double)v);
        }
        s->lora_scales[i] = v;
        snprintf(s->lora_paths[i], sizeof s->lora_paths[i], "%s", p->lora_paths && p->lora_paths[i] ? p->lora_paths[i] : "");
    }
    for (int32_t i = 0; i < p->n_lora_names; i++) snprintf(s->lora_names[i], sizeof s->lora_names[i], "%s", p->lora_names[i]);
    s->p.lora_names = NULL;
    s->p.lora_scales = NULL;
    s->p.lora_paths = NULL;
    s->p.host = NULL;
    s->p.api_key = NULL;
    s->p.model_name = NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)p->port);
    const char *host = p->host ? p->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fl_status st = fl_set_error(FL_ERR_INVALID, "cannot bind to '%s': give an IPv4 address such as 127.0.0.1", host);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        fl_free(FL_MEM_NET, s, sizeof *s);
        return st;
    }
    /* HTTPS: the key and certificate read whole (libmicrohttpd hands them to GnuTLS) */
    const bool tls = p->ssl_key_file || p->ssl_cert_file;
    if (tls) {
        fl_status st = FL_OK;
        if (!p->ssl_key_file || !p->ssl_cert_file)
            st = fl_set_error(FL_ERR_INVALID, "HTTPS needs both a key (--ssl-key-file) and a certificate (--ssl-cert-file)");
        else if (!MHD_is_feature_supported(MHD_FEATURE_TLS))
            st = fl_set_error(FL_ERR_UNSUPPORTED, "this libmicrohttpd was built without TLS: HTTPS is not available");
        else if ((st = read_pem(p->ssl_key_file, "key", &s->tls_key, &s->tls_key_n)) == FL_OK)
            st = read_pem(p->ssl_cert_file, "certificate", &s->tls_cert, &s->tls_cert_n);
        if (st != FL_OK) {
            free_tls(s);
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->work_cv);
            fl_free(FL_MEM_NET, s, sizeof *s);
            return st;
        }
    }
    if (pthread_create(&s->driver, NULL, driver_main, s)) {
        free_tls(s);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        fl_free(FL_MEM_NET, s, sizeof *s);
        return fl_set_error(FL_ERR_INTERNAL, "cannot start the driver thread");
    }
    struct MHD_OptionItem tls_opts[] = {{MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key}, {MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert},
                                        {MHD_OPTION_END, 0, NULL}};
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                                  (tls ? MHD_USE_TLS : 0),
                              0, NULL, NULL, srv_handle, s,
                              MHD_OPTION_ARRAY, tls ? tls_opts : tls_opts + 2,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned int)s->p.max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)120,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, SRV_CONN_POOL,
                              MHD_OPTION_NOTIFY_CONNECTION, srv_connection_notify, s,
                              MHD_OPTION_NOTIFY_COMPLETED, srv_request_completed, s,
                              MHD_OPTION_END);
    if (!s->mhd) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_signal(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->driver, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        free_tls(s);
        fl_free(FL_MEM_NET, s, sizeof *s);
        return fl_set_error(FL_ERR_IO, tls ? "cannot listen on %s:%d over HTTPS (the port is in use or not permitted, or the key and certificate "
                                             "are not a PEM private key and its certificate)"
                                           : "cannot listen on %s:%d (port in use or not permitted)", host, p->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    *out = s;
    return FL_OK;
}

int32_t fl_server_port(const fl_server *s) { return s->port; }

void fl_server_stop(fl_server *s, int32_t grace_ms) {
    if (!s) return;
    MHD_quiesce_daemon(s->mhd); /* stop accepting new connections */
    double t_end = srv_now() + grace_ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int32_t live = s->n_live;
        pthread_mutex_unlock(&s->mu);
        if (live == 0 || srv_now() >= t_end) break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&s->mu);
    for (srv_req *r = s->reqs; r; r = r->next) {
        srv_cancel(s, r);
        r->cancelled = true;
        pthread_cond_broadcast(&r->cv);
    }
    s->stopping = true;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->mhd); /* joins connection threads; their readers see stopping */
    pthread_mutex_lock(&s->mu);
    s->engine_active = 0;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->driver, NULL);
    srv_resp_store_free(s);
    free_tls(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    fl_free(FL_MEM_NET, s, sizeof *s);
}
