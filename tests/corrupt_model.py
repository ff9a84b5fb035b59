#!/usr/bin/env python3
"""Write variants of a GGUF model, each with one header field patched in place (the file stays a
well-formed GGUF, so each variant reaches the model loader): every numeric metadata value of the
architecture and tokenizer set to 0, 1, -1, a huge value or its neighbours, float values to 0,
-1, NaN and infinity; the shape, type and data offset of a few tensors; and in the tokenizer's
arrays, token types out of range, scores that are NaN or infinite, and token texts with a byte
that is not UTF-8 or a NUL.
usage: corrupt_model.py IN.gguf OUTDIR [--any] [--every N]  (prints one line per variant: file
name and what changed).  --any: any GGUF (a training checkpoint, say): every scalar key and every
tensor, no tokenizer arrays.  --every N: write only every N-th variant (the first, the N+1-th, ...)."""
import math, os, struct, sys

SCALAR = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}

def parse(buf):
    off = 4
    version, n_t, n_kv = struct.unpack_from('<IQQ', buf, off); off += 20
    def string(o):
        n, = struct.unpack_from('<Q', buf, o)
        return buf[o + 8:o + 8 + n].decode('utf-8', 'replace'), o + 8 + n
    def skip_value(t, o):
        if t in SCALAR: return o + struct.calcsize('<' + SCALAR[t])
        if t == 8: return string(o)[1]
        et, n = struct.unpack_from('<IQ', buf, o); o += 12
        if et in SCALAR: return o + n * struct.calcsize('<' + SCALAR[et])
        for _ in range(n): o = skip_value(et, o)
        return o
    kvs, tensors, arrays = [], [], {}
    for _ in range(n_kv):
        key, off = string(off)
        t, = struct.unpack_from('<I', buf, off); off += 4
        kvs.append((key, t, off))
        if t == 9:  # remember where each element starts: (element type, [offsets])
            et, n = struct.unpack_from('<IQ', buf, off)
            o, items = off + 12, []
            for _ in range(min(n, 4096)):
                items.append(o)
                o = skip_value(et, o)
            arrays[key] = (et, items)
        off = skip_value(t, off)
    for _ in range(n_t):
        name, off = string(off)
        nd, = struct.unpack_from('<I', buf, off); off += 4
        ne_off = off; off += 8 * nd
        type_off = off; off += 4
        data_off = off; off += 8
        tensors.append((name, nd, ne_off, type_off, data_off))
    return kvs, tensors, arrays

def main(src, out, any_file=False, every=1):
    buf = open(src, 'rb').read()
    kvs, tensors, arrays = parse(buf)
    os.makedirs(out, exist_ok=True)
    n = 0
    def emit(what, off, fmt, value):
        nonlocal n
        n += 1
        if (n - 1) % every:
            return
        b = bytearray(buf)
        struct.pack_into('<' + fmt, b, off, value)
        name = 'v%03d.gguf' % (n - 1)
        open(os.path.join(out, name), 'wb').write(b)
        print(name, what)
    for key, t, off in kvs:
        if t not in SCALAR or t == 7 or not (any_file or key.startswith('llama.') or key.startswith('tokenizer.ggml.')):
            continue
        fmt = SCALAR[t]
        if fmt in 'fd':
            for v in (0.0, -1.0, math.nan, math.inf):
                emit('%s = %r' % (key, v), off, fmt, v)
            continue
        cur, = struct.unpack_from('<' + fmt, buf, off)
        bits = struct.calcsize(fmt) * 8
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if fmt.islower() else (0, (1 << bits) - 1)
        for v in sorted({0, 1, cur - 1, cur + 1, 2 * cur + 1, hi, lo, 1 << 20}):
            if lo <= v <= hi and v != cur:
                emit('%s = %d (was %d)' % (key, v, cur), off, fmt, v)
    picks = [t for t in tensors if t[0] in ('token_embd.weight', 'output.weight', 'output_norm.weight',
                                            'blk.0.attn_q.weight', 'blk.0.attn_k.weight', 'blk.0.ffn_down.weight',
                                            'blk.0.attn_norm.weight') or any_file]
    for name, nd, ne_off, type_off, data_off in picks:
        for d in range(nd):
            cur, = struct.unpack_from('<Q', buf, ne_off + 8 * d)
            for v in (0, 1, cur + 1, cur * 2, cur // 2, 1 << 40, (1 << 64) - 1):
                if v != cur:
                    emit('%s ne[%d] = %d (was %d)' % (name, d, v, cur), ne_off + 8 * d, 'Q', v)
        cur, = struct.unpack_from('<I', buf, type_off)
        for v in (0, 1, 2, 8, 12, 14, 30, 39, 1000):
            if v != cur:
                emit('%s type = %d (was %d)' % (name, v, cur), type_off, 'I', v)
        cur, = struct.unpack_from('<Q', buf, data_off)
        for v in (cur + 32, len(buf), (1 << 64) - 32, 0):
            if v != cur:
                emit('%s offset = %d (was %d)' % (name, v, cur), data_off, 'Q', v)
    if not any_file:
        tokenizer_variants(buf, arrays, emit)

def tokenizer_variants(buf, arrays, emit):
    ids = (0, 1, 2, 3, 100, 259, 511)
    if 'tokenizer.ggml.token_type' in arrays:
        et, items = arrays['tokenizer.ggml.token_type']
        fmt = SCALAR[et]
        for i in ids:
            if i < len(items):
                for v in (0, 2, 3, 6, 99, -1 if fmt.islower() else 255):
                    emit('token_type[%d] = %d' % (i, v), items[i], fmt, v)
    if 'tokenizer.ggml.scores' in arrays:
        et, items = arrays['tokenizer.ggml.scores']
        for i in ids:
            if i < len(items) and et == 6:
                for v in (math.nan, math.inf, -math.inf):
                    emit('scores[%d] = %r' % (i, v), items[i], 'f', v)
    if 'tokenizer.ggml.tokens' in arrays:
        _, items = arrays['tokenizer.ggml.tokens']
        for i in ids:
            if i < len(items):
                n, = struct.unpack_from('<Q', buf, items[i])
                if n > 0:
                    for v in (0xFF, 0x00, 0xC3):
                        emit('tokens[%d] byte 0 = 0x%02X' % (i, v), items[i] + 8, 'B', v)

if __name__ == '__main__':
    opts = sys.argv[3:]
    main(sys.argv[1], sys.argv[2], '--any' in opts, int(opts[opts.index('--every') + 1]) if '--every' in opts else 1)
