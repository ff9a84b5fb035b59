#!/usr/bin/env python3
"""Write small synthetic GGUF seed files for fuzz_gguf into DIR (every value type, nested and
string arrays, a few tiny tensors of different block types, a non-default alignment)."""
import struct, sys, os

def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b

def kv(key, t, payload):
    return s(key) + struct.pack('<I', t) + payload

def gguf(kvs, tensors, align=32, version=3):
    out = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(kvs)) + b''.join(kvs)
    off = 0
    datas = []
    for name, ne, typ, data in tensors:
        out += s(name) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', n) for n in ne)
        out += struct.pack('<IQ', typ, off)
        datas.append((off, data))
        off = (off + len(data) + align - 1) // align * align
    out += b'\0' * ((-len(out)) % align)
    body = bytearray(off)
    for o, d in datas:
        body[o:o + len(d)] = d
    return out + bytes(body)

def main(d):
    os.makedirs(d, exist_ok=True)
    scal = [kv('a.u8', 0, b'\x07'), kv('a.i8', 1, b'\xff'), kv('a.u16', 2, struct.pack('<H', 513)),
            kv('a.i16', 3, struct.pack('<h', -2)), kv('a.u32', 4, struct.pack('<I', 5)),
            kv('a.i32', 5, struct.pack('<i', -7)), kv('a.f32', 6, struct.pack('<f', 1.5)),
            kv('a.bool', 7, b'\x01'), kv('general.architecture', 8, s('llama')),
            kv('a.u64', 10, struct.pack('<Q', 1 << 40)), kv('a.i64', 11, struct.pack('<q', -(1 << 40))),
            kv('a.f64', 12, struct.pack('<d', 2.25))]
    arrs = [kv('a.arr_i32', 9, struct.pack('<IQ', 5, 3) + struct.pack('<3i', 1, -2, 3)),
            kv('a.arr_f32', 9, struct.pack('<IQ', 6, 2) + struct.pack('<2f', 0.5, -1)),
            kv('a.arr_str', 9, struct.pack('<IQ', 8, 3) + s('x') + s('') + s('hello')),
            kv('a.arr_arr', 9, struct.pack('<IQ', 9, 2) + struct.pack('<IQ', 4, 1) + struct.pack('<I', 9)
               + struct.pack('<IQ', 8, 1) + s('n'))]
    f32 = struct.pack('<8f', *range(8))
    q8 = (b'\x00\x3c' + bytes(range(32)))  # one q8_0 block (scale f16 1.0)
    tensors = [('t.f32', [8], 0, f32), ('t.f16', [4, 2], 1, b'\x00\x3c' * 8), ('t.q8_0', [32], 8, q8),
               ('t.empty', [0, 3], 0, b'')]
    open(os.path.join(d, 'seed_all_types.gguf'), 'wb').write(gguf(scal + arrs, tensors))
    open(os.path.join(d, 'seed_align64_v2.gguf'), 'wb').write(
        gguf([kv('general.alignment', 4, struct.pack('<I', 64))] + scal[:3], tensors[:2], align=64, version=2))
    open(os.path.join(d, 'seed_kv_only.gguf'), 'wb').write(gguf(arrs, []))
    open(os.path.join(d, 'seed_empty.gguf'), 'wb').write(gguf([], []))

if __name__ == '__main__':
    main(sys.argv[1])
