/*
 * engine.h - internal extras of the engine (the public API is in include/fitllm.h).
 *
 * The engine (engine.c) owns a backend (backend.h: model + KV cache + tokenizer), a scheduler
 * (scheduler.h) and every request (request.h) until its final event has been polled.  Thread
 * safety: fl_engine_add / cancel / poll / stats_get may be called from any thread; step from one
 * driver thread at a time.
 */
#ifndef FL_ENGINE_H
#define FL_ENGINE_H

#include "fitllm.h"

/* Seconds spent inside the backend's forward since the engine was created (driver thread). */
double fl_engine_forward_seconds(const fl_engine *e);

#endif
