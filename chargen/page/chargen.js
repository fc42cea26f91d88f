// chargen.js: sample a chargen model in the visitor's browser. Hand-written, no
// dependencies, no build step; it fetches model.json and weights.bin from beside it, nothing
// else.
//
// It mirrors chargen/portable.py operation for operation (read that module's docstring
// for the why of each), so that for the same seed the page draws the text that
// `chargen sample MODEL --rng portable --seed SEED` draws: with fp32 weights, exactly.
// The products and the LSTM cell run in small WebAssembly SIMD kernels assembled below from
// their opcodes; where WebAssembly SIMD is missing, JavaScript computes the same bits, slower.
"use strict";

const LANES = 8;
const PAD = 0, UNK = 1, BOS = 2, EOS = 3, SPECIALS = 4;

// ---- PCG32: pcg32_srandom_r(seed, stream), pcg32_random_r ---------------------------------
const M64 = (1n << 64n) - 1n, PCG_MULT = 6364136223846793005n;

class PCG32 {
  constructor(seed, stream) {
    this.inc = ((BigInt(stream) << 1n) | 1n) & M64;
    this.state = 0n;
    this.next();
    this.state = (this.state + BigInt(seed)) & M64;
    this.next();
  }
  next() {
    const old = this.state;
    this.state = (old * PCG_MULT + this.inc) & M64;
    const shifted = Number((((old >> 18n) ^ old) >> 27n) & 0xffffffffn);
    const rot = Number(old >> 59n);
    return ((shifted >>> rot) | (shifted << ((32 - rot) & 31))) >>> 0;
  }
  uniform() {  // [0, 1) on the 2**53 grid, from two outputs
    const a = this.next() >>> 5, b = this.next() >>> 6;
    return (a * 67108864 + b) / 9007199254740992;
  }
}

// ---- exp64: + - * / only, as portable.exp64 ------------------------------------------------
const LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
const INV_LN2 = 1.44269504088896338700e+00, EXP_MIN = -708, EXP_MAX = 709;
const [E0, E1, E2, E3, E4, E5, E6, E7, E8, E9, E10, E11] = (() => {  // 1/k!, k = 0..11
  const factorial = [1];
  for (let k = 1; k <= 11; k++) factorial.push(factorial[k - 1] * k);
  return factorial.map((f) => 1 / f);
})();
const POW2 = (() => {  // POW2[n + 1022] = 2**n, exactly
  const table = new Float64Array(2046);
  table[1022] = 1;
  for (let n = 1; n <= 1023; n++) table[1022 + n] = table[1021 + n] * 2;
  for (let n = -1; n >= -1022; n--) table[1022 + n] = table[1023 + n] / 2;
  return table;
})();

function exp64(x) {
  if (x > EXP_MAX) return Infinity;
  if (!(x >= EXP_MIN)) return 0;  // (and -Infinity)
  const n = Math.floor(x * INV_LN2 + 0.5);
  const r = (x - n * LN2_HI) - n * LN2_LO;
  const r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;  // (Estrin's scheme, as in portable.exp64)
  const p = (((E0 + E1 * r) + (E2 + E3 * r) * r2) + ((E4 + E5 * r) + (E6 + E7 * r) * r2) * r4)
    + ((E8 + E9 * r) + (E10 + E11 * r) * r2) * r8;
  return p * POW2[n + 1022];
}
const sigmoid32 = (x) => Math.fround(1 / (1 + exp64(-x)));
const tanh32 = (x) => Math.fround(1 - 2 / (exp64(2 * x) + 1));

// ---- the WebAssembly kernels ----------------------------------------------------------------
// matvec(w, x, bias, out, rows, cols, samples, stride), pointers in bytes: for each row r and
// sample s, out[s * stride + r] = dot(w[r], x[s]) + bias[r] in float32, w row-major with cols
// (a multiple of 8) floats a row. Two f32x4 accumulators: lane j of the first sums columns j,
// j + 8, ...; of the second, columns j + 4, j + 12, ...; then the two added, then
// (l0 + l1) + (l2 + l3). "matvec4" takes four rows at a time (rows a multiple of 4): their
// eight accumulators are independent chains that the CPU overlaps, at each row's own order;
// "matvec1" one.
//
// cell(x, g, c, h, rows, H, width): the LSTM cell of ``cell`` below, two units at a time in
// float64x2 lanes (exp64, the sigmoid and tanh exactly as the scalar functions above:
// the same operations on the same numbers give the same bits), c and h updated in place.
function kernelModule() {
  const uleb = (n) => { const out = []; do { let b = n & 127; n >>>= 7; if (n) b |= 128; out.push(b); } while (n); return out; };
  const section = (id, bytes) => [id, ...uleb(bytes.length), ...bytes];
  const vec = (items) => [...uleb(items.length), ...items.flat()];
  const name = (text) => vec([...text].map((c) => [c.charCodeAt(0)]));
  const I32 = 0x7f, V128 = 0x7b;
  const get = (i) => [0x20, i], set = (i) => [0x21, i], i32 = (v) => [0x41, ...uleb(v)];  // (constants below 64)
  const call = (f) => [0x10, f];
  const add = 0x6a, mul = 0x6c, shl = 0x74, ltu = 0x49, fadd = 0x92, loop = [0x03, 0x40], end = 0x0b;
  const simd = (op, ...imm) => [0xfd, ...uleb(op), ...imm];
  const load = (offset) => simd(0, 4, ...uleb(offset)), f4add = simd(228), f4mul = simd(230);
  const lane = (v, j) => [...get(v), ...simd(31, j)];
  const bytes = (typed) => [...new Uint8Array(typed.buffer)];
  const zero = simd(12, ...new Array(16).fill(0));
  const f64s = (v) => simd(12, ...bytes(new Float64Array([v, v])));  // v128.const f64x2 v v
  const d2 = { add: simd(240), sub: simd(241), mul: simd(242), div: simd(243), floor: simd(117), neg: simd(237),
    lt: simd(73), gt: simd(74), pmin: simd(246), pmax: simd(247) };
  const promote = simd(95), demote = simd(94), load64 = simd(93, 3, 0), store64 = simd(91, 3, 0, 0), store32 = simd(90, 2, 0, 0);
  // (function indices, in the order of the function section)
  const [MATVEC4, MATVEC1, CELL, EXP, SIGMOID, TANH] = [0, 1, 2, 3, 4, 5];
  const functions = [matvecBody(4), matvecBody(1), cellBody(), expBody(), sigmoidBody(), tanhBody()];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vec([[0x60, ...vec(new Array(8).fill([I32])), 0],  // 0: (i32 x 8) -> ()
      [0x60, ...vec(new Array(7).fill([I32])), 0],  // 1: (i32 x 7) -> ()
      [0x60, 1, V128, 1, V128]])),  // 2: (v128) -> v128
    ...section(2, vec([[...name("env"), ...name("mem"), 0x02, 0x00, 0x01]])),  // the memory, imported
    ...section(3, vec([[0], [0], [1], [2], [2], [2]])),
    ...section(7, vec([[...name("matvec4"), 0x00, MATVEC4], [...name("matvec1"), 0x00, MATVEC1],
      [...name("cell"), 0x00, CELL]])),
    ...section(10, vec(functions.map((code) => [...uleb(code.length), ...code]))),
  ]);

  function matvecBody(group) {
    const [W, X, BIAS, OUT, ROWS, COLS, SAMPLES, STRIDE, R, S, XP, XE, ROWBYTES] = Array.from({ length: 13 }, (_, i) => i);
    const WP = (g) => 13 + g, XL = 13 + group, XH = 14 + group, A = (g) => 15 + group + g, B = (g) => 15 + 2 * group + g;
    const each = (f) => Array.from({ length: group }, (_, g) => f(g)).flat();
    const body = [
      ...get(COLS), ...i32(2), shl, ...set(ROWBYTES),
      ...loop,  // over groups of rows
      ...i32(0), ...set(S),
      ...loop,  // over samples
      ...each((g) => [...get(W), ...get(R), ...i32(g), add, ...get(ROWBYTES), mul, add, ...set(WP(g)),
        ...zero, ...set(A(g)), ...zero, ...set(B(g))]),
      ...get(X), ...get(S), ...get(ROWBYTES), mul, add, ...set(XP),
      ...get(XP), ...get(ROWBYTES), add, ...set(XE),
      ...loop,  // over columns, 8 at a time
      ...get(XP), ...load(0), ...set(XL), ...get(XP), ...load(16), ...set(XH),
      ...each((g) => [
        ...get(A(g)), ...get(WP(g)), ...load(0), ...get(XL), ...f4mul, ...f4add, ...set(A(g)),
        ...get(B(g)), ...get(WP(g)), ...load(16), ...get(XH), ...f4mul, ...f4add, ...set(B(g)),
        ...get(WP(g)), ...i32(32), add, ...set(WP(g))]),
      ...get(XP), ...i32(32), add, ...set(XP),
      ...get(XP), ...get(XE), ltu, 0x0d, 0, end,
      ...each((g) => [
        ...get(A(g)), ...get(B(g)), ...f4add, ...set(A(g)),
        ...get(OUT), ...get(S), ...get(STRIDE), mul, ...get(R), add, ...i32(g), add, ...i32(2), shl, add,  // (the address)
        ...lane(A(g), 0), ...lane(A(g), 1), fadd, ...lane(A(g), 2), ...lane(A(g), 3), fadd, fadd,
        ...get(BIAS), ...get(R), ...i32(g), add, ...i32(2), shl, add, 0x2a, 2, 0, fadd,  // + bias[r + g]
        0x38, 2, 0]),  // f32.store
      ...get(S), ...i32(1), add, ...set(S), ...get(S), ...get(SAMPLES), ltu, 0x0d, 0, end,
      ...get(R), ...i32(group), add, ...set(R), ...get(R), ...get(ROWS), ltu, 0x0d, 0, end,
      end,
    ];
    return [...vec([[5 + group, I32], [2 + 2 * group, V128]]), ...body];  // locals: R to WP(g), then XL to B(g)
  }

  function cellBody() {
    const [X, G, C, H, ROWS, UNITS, WIDTH, S, J, XP, GP, CP, HP, GATE, I, F, U, O, NEXT] = Array.from({ length: 19 }, (_, i) => i);
    const gate = (k, f) => [  // f(x[k H + j] + g[k H + j]) for two units
      ...get(XP), ...(k ? [...get(GATE), ...i32(k), mul, add] : []), ...load64,
      ...get(GP), ...(k ? [...get(GATE), ...i32(k), mul, add] : []), ...load64, ...f4add, ...call(f)];
    const store = (at, v) => [  // two floats, or one for the last unit of an odd H
      ...get(J), ...i32(1), add, ...get(UNITS), ltu, 0x04, 0x40, ...get(at), ...get(v), ...store64,
      0x05, ...get(at), ...get(v), ...store32, end];
    const body = [
      ...get(UNITS), ...i32(2), shl, ...set(GATE),  // bytes between two gates' blocks
      ...loop,  // over rows
      ...get(X), ...get(S), ...get(GATE), mul, ...i32(2), shl, add, ...set(XP),  // (4 gates a row)
      ...get(G), ...get(S), ...get(GATE), mul, ...i32(2), shl, add, ...set(GP),
      ...get(C), ...get(S), ...get(GATE), mul, add, ...set(CP),
      ...get(H), ...get(S), ...get(WIDTH), mul, ...i32(2), shl, add, ...set(HP),
      ...i32(0), ...set(J),
      ...loop,  // over units, two at a time
      ...gate(0, SIGMOID), ...set(I), ...gate(1, SIGMOID), ...set(F), ...gate(2, TANH), ...set(U),
      ...gate(3, SIGMOID), ...set(O),
      ...get(F), ...get(CP), ...load64, ...f4mul, ...get(I), ...get(U), ...f4mul, ...f4add, ...set(NEXT),
      ...store(CP, NEXT),
      ...get(O), ...get(NEXT), ...call(TANH), ...f4mul, ...set(U),
      ...store(HP, U),
      ...get(XP), ...i32(8), add, ...set(XP), ...get(GP), ...i32(8), add, ...set(GP),
      ...get(CP), ...i32(8), add, ...set(CP), ...get(HP), ...i32(8), add, ...set(HP),
      ...get(J), ...i32(2), add, ...set(J), ...get(J), ...get(UNITS), ltu, 0x0d, 0, end,
      ...get(S), ...i32(1), add, ...set(S), ...get(S), ...get(ROWS), ltu, 0x0d, 0, end,
      end,
    ];
    return [...vec([[7, I32], [5, V128]]), ...body];
  }

  function expBody() {  // exp64 on two float64 lanes, as the scalar exp64
    const [T, TC, N, R, R2, R4] = [0, 1, 2, 3, 4, 5];
    const term = (a, b) => [...f64s(a), ...f64s(b), ...get(R), ...d2.mul, ...d2.add];  // a + b r
    const body = [
      ...get(T), ...f64s(EXP_MIN), ...d2.pmax, ...f64s(EXP_MAX), ...d2.pmin, ...set(TC),
      ...get(TC), ...f64s(INV_LN2), ...d2.mul, ...f64s(0.5), ...d2.add, ...d2.floor, ...set(N),
      ...get(TC), ...get(N), ...f64s(LN2_HI), ...d2.mul, ...d2.sub, ...get(N), ...f64s(LN2_LO), ...d2.mul, ...d2.sub, ...set(R),
      ...get(R), ...get(R), ...d2.mul, ...set(R2), ...get(R2), ...get(R2), ...d2.mul, ...set(R4),
      ...term(E0, E1), ...term(E2, E3), ...get(R2), ...d2.mul, ...d2.add,
      ...term(E4, E5), ...term(E6, E7), ...get(R2), ...d2.mul, ...d2.add, ...get(R4), ...d2.mul, ...d2.add,
      ...term(E8, E9), ...term(E10, E11), ...get(R2), ...d2.mul, ...d2.add, ...get(R4), ...get(R4), ...d2.mul, ...d2.mul,
      ...d2.add,  // the polynomial
      ...get(N), ...simd(252, 1), ...simd(199, 1),  // n as i64x2 (i32x4.trunc_sat_f64x2_s_zero, i64x2.extend_low_i32x4_s)
      ...simd(12, ...bytes(new BigInt64Array([1023n, 1023n]))), ...simd(206, 1), ...i32(52), ...simd(203, 1),  // 2**n
      ...d2.mul,
      ...get(T), ...f64s(EXP_MIN), ...d2.lt, ...simd(79),  // andnot: 0 below EXP_MIN (and -Infinity)
      ...set(TC), ...f64s(Infinity), ...get(TC), ...get(T), ...f64s(EXP_MAX), ...d2.gt, ...simd(82),  // Infinity above EXP_MAX
      end,
    ];
    return [...vec([[5, V128]]), ...body];
  }

  function sigmoidBody() {  // float32(1 / (1 + exp64(-x))) on the two low float32 lanes
    return [0, ...f64s(1), ...f64s(1), ...get(0), ...promote, ...d2.neg, ...call(EXP), ...d2.add, ...d2.div, ...demote, end];
  }

  function tanhBody() {  // float32(1 - 2 / (exp64(2 x) + 1))
    return [0, ...f64s(1), ...f64s(2), ...get(0), ...promote, ...f64s(2), ...d2.mul, ...call(EXP), ...f64s(1), ...d2.add,
      ...d2.div, ...d2.sub, ...demote, end];
  }
}

// The same products in JavaScript: Math.fround after each operation is float32 arithmetic.
function matvecJS(F, w, x, bias, out, rows, cols, samples) {  // offsets in floats
  const fr = Math.fround;
  for (let r = 0; r < rows; r++) {
    const wr = w + r * cols;
    for (let s = 0; s < samples; s++) {
      const xs = x + s * cols;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      for (let k = 0; k < cols; k += 8) {
        a0 = fr(a0 + fr(F[wr + k] * F[xs + k])); a1 = fr(a1 + fr(F[wr + k + 1] * F[xs + k + 1]));
        a2 = fr(a2 + fr(F[wr + k + 2] * F[xs + k + 2])); a3 = fr(a3 + fr(F[wr + k + 3] * F[xs + k + 3]));
        b0 = fr(b0 + fr(F[wr + k + 4] * F[xs + k + 4])); b1 = fr(b1 + fr(F[wr + k + 5] * F[xs + k + 5]));
        b2 = fr(b2 + fr(F[wr + k + 6] * F[xs + k + 6])); b3 = fr(b3 + fr(F[wr + k + 7] * F[xs + k + 7]));
      }
      const h0 = fr(a0 + b0), h1 = fr(a1 + b1), h2 = fr(a2 + b2), h3 = fr(a3 + b3);
      F[out + s * rows + r] = fr(fr(h0 + h1) + fr(h2 + h3)) + F[bias + r];  // (the store rounds)
    }
  }
}

function halfToFloat(bits) {  // IEEE binary16 -> number, exactly
  const sign = bits & 0x8000 ? -1 : 1, exponent = (bits >> 10) & 31, fraction = bits & 1023;
  if (exponent === 0) return sign * fraction * 2 ** -24;
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * (1024 + fraction) * 2 ** (exponent - 25);
}

// ---- the model ----------------------------------------------------------------------------
class Model {
  constructor(header, bytes, kernel = "auto") {
    Object.assign(this, { header, hidden: header.hidden, layers: header.layers, vocab: header.vocab_size });
    this.width = Math.ceil(this.hidden / LANES) * LANES;  // h, padded
    const floats = header.tensors.reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
    this.memory = new WebAssembly.Memory({ initial: 1 });
    this.top = 0;
    const weights = this.alloc(floats);
    this.useKernel(kernel);
    const F = this.F;
    if (header.weights.dtype === "float16") {
      const half = new Uint16Array(bytes.buffer, bytes.byteOffset, floats);
      for (let i = 0; i < floats; i++) F[weights + i] = halfToFloat(half[i]);
    } else {
      F.set(new Float32Array(bytes.buffer, bytes.byteOffset, floats), weights);
    }
    this.t = {};
    for (const t of header.tensors) this.t[t.name] = weights + t.offset;
    this.layer = Array.from({ length: this.layers }, (_, k) => ({  // each layer's tensors, looked up once
      ih: this.t[`lstm.weight_ih_l${k}`], hh: this.t[`lstm.weight_hh_l${k}`],
      bih: this.t[`lstm.bias_ih_l${k}`], bhh: this.t[`lstm.bias_hh_l${k}`] }));
    const embed = header.tensors[0];
    // Layer 0's input part for every id, once: (vocab, 4 hidden).
    this.table = this.alloc(this.vocab * 4 * this.hidden);
    this.matvec(this.t["lstm.weight_ih_l0"], this.t["embed.weight"], this.t["lstm.bias_ih_l0"], this.table,
      4 * this.hidden, embed.shape[1], this.vocab);
    this.rows = 0;
  }

  useKernel(kernel) {
    let instance = null;
    if (kernel !== "js") {
      try {
        instance = new WebAssembly.Instance(new WebAssembly.Module(kernelModule()), { env: { mem: this.memory } });
      } catch (e) {
        if (kernel === "wasm") throw e;  // (asked for; otherwise a browser without SIMD gets the JS loop)
      }
    }
    this.kernel = instance ? "wasm-simd" : "js";
    this.cell = instance ? (x, g, c, h, n) => instance.exports.cell(4 * x, 4 * g, 4 * c, 4 * h, n, this.hidden, this.width)
      : (x, g, c, h, n) => cell(this.F, x, g, c, h, n, this.hidden, this.width);
    this.matvec = instance ? (w, x, b, out, rows, cols, n) => {
      const { matvec4, matvec1 } = instance.exports, four = rows - (rows % 4);
      if (four) matvec4(4 * w, 4 * x, 4 * b, 4 * out, four, cols, n, rows);
      if (four < rows) matvec1(4 * (w + four * cols), 4 * x, 4 * (b + four), 4 * (out + four), rows - four, cols, n, rows);
    } : (w, x, b, out, rows, cols, n) => matvecJS(this.F, w, x, b, out, rows, cols, n);
  }

  alloc(floats) {  // a float offset in the memory, grown as needed
    const start = this.top;
    this.top += Math.ceil(floats / 4) * 4;
    const pages = Math.ceil((this.top * 4) / 65536) - this.memory.buffer.byteLength / 65536;
    if (pages > 0) this.memory.grow(pages);
    this.F = new Float32Array(this.memory.buffer);
    return start;
  }

  ensureRows(n) {  // buffers for n rows: each layer's h (padded) and c, the gates, the logits
    if (n <= this.rows) return;
    const H = this.hidden;
    this.h = [], this.c = [];
    for (let k = 0; k < this.layers; k++) { this.h.push(this.alloc(n * this.width)); this.c.push(this.alloc(n * H + 2)); }
    this.gates = this.alloc(n * 4 * H);
    this.input = this.alloc(n * 4 * H);
    this.logits = this.alloc(n * this.vocab);
    this.rows = n;
  }

  // The state is kept as plain arrays outside the memory, so that samplers do not share it.
  initialState(n) {
    return Array.from({ length: this.layers }, () => ({ h: new Float32Array(n * this.width), c: new Float32Array(n * this.hidden) }));
  }

  // Logits (n rows of vocab, a Float32Array view valid until the next step) for ``ids``;
  // ``state`` is stepped in place.
  step(ids, state) {
    const n = ids.length, H = this.hidden, G = 4 * H;
    this.ensureRows(n);
    const F = this.F;
    for (let k = 0; k < this.layers; k++) {
      const { ih, hh, bih, bhh } = this.layer[k];
      F.set(state[k].h, this.h[k]);
      this.matvec(hh, this.h[k], bhh, this.gates, G, this.width, n);
      if (k > 0) {
        this.matvec(ih, this.h[k - 1], bih, this.input, G, this.width, n);
      } else {
        for (let s = 0; s < n; s++) F.copyWithin(this.input + s * G, this.table + ids[s] * G, this.table + (ids[s] + 1) * G);
      }
      F.set(state[k].c, this.c[k]);
      this.cell(this.input, this.gates, this.c[k], this.h[k], n);  // (h[k], the next layer's input)
      state[k].h.set(F.subarray(this.h[k], this.h[k] + n * this.width));
      state[k].c.set(F.subarray(this.c[k], this.c[k] + n * H));
    }
    this.matvec(this.t["head.weight"], this.h[this.layers - 1], this.t["head.bias"], this.logits, this.vocab, this.width, n);
    return new Float32Array(this.memory.buffer, 4 * this.logits, n * this.vocab);
  }
}

// The LSTM cell on n rows, c and h updated in place (offsets in floats into F): gates =
// x + g, in blocks i, f, g, o of H; the row strides are 4 H (x, g), H (c) and width (h).
function cell(F, x, g, c, h, n, H, width) {
  const fr = Math.fround;
  for (let s = 0; s < n; s++) {
    const at = s * 4 * H, hs = h + s * width, cs = c + s * H;
    for (let j = 0; j < H; j++) {
      const a = at + j;
      const i = sigmoid32(fr(F[x + a] + F[g + a])), f = sigmoid32(fr(F[x + a + H] + F[g + a + H]));
      const u = tanh32(fr(F[x + a + 2 * H] + F[g + a + 2 * H])), o = sigmoid32(fr(F[x + a + 3 * H] + F[g + a + 3 * H]));
      const next = fr(fr(f * F[cs + j]) + fr(i * u));
      F[cs + j] = next;
      F[hs + j] = o * tanh32(next);  // (the store rounds to float32)
    }
  }
}

// ---- the draw: as portable.pick ---------------------------------------------------------------
function pick(logits, at, allowed, count, options, u) {
  const V = allowed.length, values = new Float64Array(V);
  for (let i = 0; i < V; i++) values[i] = allowed[i] ? logits[at + i] : -Infinity;
  if (options.temperature === 0) {
    let best = 0;
    for (let i = 1; i < V; i++) if (values[i] > values[best]) best = i;
    return best;
  }
  let top = -Infinity;
  for (let i = 0; i < V; i++) if (values[i] > top) top = values[i];
  const scaled = values.map((v) => (v - top) / options.temperature);
  if (options.top_k > 0 && options.top_k < count) {
    const kth = Float64Array.from(scaled).sort()[V - options.top_k];  // the k-th largest
    for (let i = 0; i < V; i++) if (scaled[i] < kth) scaled[i] = -Infinity;
  }
  const weights = scaled.map(exp64);
  if (options.top_p < 1) {
    const order = Array.from({ length: V }, (_, i) => i)
      .sort((a, b) => (scaled[a] > scaled[b] ? -1 : scaled[a] < scaled[b] ? 1 : a - b));  // likeliest first; ties by id
    let total = 0;
    for (const i of order) total += weights[i];
    const limit = options.top_p * total, cut = [];
    let running = 0;
    order.forEach((i, rank) => {
      running += weights[i];
      if (rank > 0 && running - weights[i] >= limit) cut.push(i);
    });
    for (const i of cut) weights[i] = 0;
  }
  let total = 0;
  for (let i = 0; i < V; i++) total += weights[i];
  const target = u * total;
  let running = 0, last = 0;
  for (let i = 0; i < V; i++) {
    running += weights[i];
    if (running > target) return i;
    if (weights[i] !== 0) last = i;
  }
  return last;
}

// ---- the sampler: as portable.PortableSampler ---------------------------------------------------
class Sampler {
  constructor(model, primeIds, samples, seed) {
    const items = model.header.items;
    this.model = model;
    this.samples = samples;
    this.items = items;
    this.rngs = Array.from({ length: samples }, (_, j) => new PCG32(seed, j));
    this.allowed = new Uint8Array(model.vocab).fill(1);
    for (const i of items ? [PAD, UNK, BOS] : [PAD, UNK, BOS, EOS]) this.allowed[i] = 0;
    this.count = this.allowed.reduce((a, b) => a + b, 0);
    this.chars = ["", "", "", "", ...model.header.chars];
    this.ended = new Array(samples).fill(false);
    this.texts = new Array(samples).fill("");
    this.prime = items ? [BOS, ...primeIds] : primeIds;
    this.pending = null;
  }

  start() {
    if (this.pending) return;
    const one = this.model.initialState(1);
    for (const i of this.prime.slice(0, -1)) this.model.step([i], one);
    this.state = one.map(({ h, c }) => ({ h: tile(h, this.samples), c: tile(c, this.samples) }));
    this.pending = new Array(this.samples).fill(this.prime[this.prime.length - 1]);
  }

  // One step: each sample's new character ("" for an item that has ended), or null once
  // every item has ended.
  step(options) {
    if (this.ended.every(Boolean)) return null;
    this.start();
    const V = this.model.vocab, logits = this.model.step(this.pending, this.state), out = [];
    for (let j = 0; j < this.samples; j++) {
      if (this.ended[j]) { out.push(""); continue; }
      const i = pick(logits, j * V, this.allowed, this.count, options, this.rngs[j].uniform());
      this.pending[j] = i;
      this.ended[j] = this.items && i === EOS;
      const piece = this.ended[j] ? "" : this.chars[i];
      this.texts[j] += piece;
      out.push(piece);
    }
    return out;
  }
}

function tile(row, n) {
  const out = new Float32Array(row.length * n);
  for (let s = 0; s < n; s++) out.set(row, s * row.length);
  return out;
}

function encodePrime(header, prime) {  // ids, or an Error naming the characters the model never saw
  const id = new Map(header.chars.map((ch, i) => [ch, i + SPECIALS]));
  const ids = [], unknown = [];
  for (const ch of prime) {
    if (id.has(ch)) ids.push(id.get(ch));
    else if (!unknown.includes(ch)) unknown.push(ch);
  }
  if (unknown.length) {
    const shown = unknown.slice(0, 10).map((c) => JSON.stringify(c)).join(", ");
    throw new Error(`the prime has characters the model never saw in training: ${shown}; remove or replace them`);
  }
  return ids;
}

async function loadModel(base = ".", kernel = "auto") {
  const header = await (await fetchOk(`${base}/model.json`)).json();
  if (header.format !== "chargen-web" || header.version !== 1) throw new Error("model.json is not a chargen web export (version 1)");
  const bytes = new Uint8Array(await (await fetchOk(`${base}/${header.weights.file}`)).arrayBuffer());
  if (bytes.length !== header.weights.bytes) {
    throw new Error(`${header.weights.file} has ${bytes.length} bytes, not ${header.weights.bytes}: export the page again`);
  }
  return new Model(header, bytes, kernel);
}

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`could not load ${url} (HTTP ${response.status}); serve this folder over http`);
  return response;
}

// ---- the page -----------------------------------------------------------------------------------
// Every control can be set from the address (?prime=...&seed=...&length=...&temperature=...
// &top_k=...&top_p=...&samples=...), so a text is shared by its link; ?autostart=0 waits
// for Generate, ?kernel=js forces the JavaScript products.
const OPTIONS = ["prime", "length", "temperature", "top_k", "top_p", "seed", "samples"];
const SLICE_MS = 30;  // steps between two updates of the page

class Page {
  constructor() {
    this.$ = (id) => document.getElementById(id);
    this.params = new URLSearchParams(location.search);
    this.timings = window.chargenTimings = {};
    Object.assign(this, { model: null, sampler: null, options: null, running: false, stop: false, nodes: [] });
    this.$("controls").addEventListener("submit", (event) => { event.preventDefault(); this.generate(); });
    this.$("continue").addEventListener("click", () => this.continue());
    this.$("stop").addEventListener("click", () => { this.stop = true; });
    loadModel(".", this.params.get("kernel") || "auto").then((model) => this.show(model))
      .catch((e) => this.status(`chargen: ${e.message}`, true));
  }

  status(text, error = false) {
    this.$("status").textContent = text;
    this.$("status").className = error ? "error" : "";
  }

  buttons() {
    this.$("generate").disabled = !this.model || this.running;
    this.$("continue").disabled = !this.sampler || this.running || this.sampler.ended.every(Boolean);
    this.$("stop").disabled = !this.running;
  }

  show(model) {  // the model loaded: its line, the controls' defaults (or the address's), and a first text
    this.timings.loaded = performance.now();
    this.model = model;
    const h = model.header, a = h.about, $ = this.$;
    document.title = $("title").textContent = `chargen: ${h.name}`;
    $("about").textContent = `${a.corpus} · ${h.items ? "one item per line" : "one stream of text"} · `
      + `${h.layers}x${h.hidden} LSTM, ${a.parameters.toLocaleString("en")} parameters`
      + `${a.val_bpc == null ? "" : ` · validation ${a.val_bpc.toFixed(3)} bits/char`} · ${h.weights.dtype} weights, ${model.kernel}`;
    const defaults = { prime: "", length: h.defaults.length, temperature: h.defaults.temperature, top_k: h.defaults.top_k,
      top_p: h.defaults.top_p, seed: "", samples: h.defaults.num_samples };
    for (const name of OPTIONS) $(name).value = this.params.get(name) ?? defaults[name];
    $("prime").placeholder = h.items ? "how every item starts (may be empty)" : "text to continue (empty: a fresh start)";
    this.buttons();
    if (this.params.get("autostart") !== "0") this.generate();
  }

  generate() {
    let options;
    try {
      options = this.readOptions();
    } catch (e) {
      return this.status(e.message, true);
    }
    const h = this.model.header, output = this.$("output");
    this.sampler = new Sampler(this.model, encodePrime(h, options.prime || h.default_prime), options.samples, options.seed);
    output.textContent = "";
    output.className = h.items ? "items" : "";
    this.nodes = Array.from({ length: options.samples }, (_, j) => {
      const pre = document.createElement("pre"), shown = document.createElement("b"), text = document.createTextNode("");
      pre.className = "sample";
      if (options.samples > 1 && !h.items) pre.title = `sample ${j + 1} of ${options.samples}`;
      shown.textContent = options.prime;
      pre.append(shown, text);
      output.append(pre);
      return text;
    });
    this.$("command").textContent = command(h, options);
    return this.run(options);
  }

  continue() {  // the same samples, prime and seed (their random streams carry on); length and the rest as set now
    try {
      const { prime, samples, seed } = this.options;
      return this.run({ ...this.readOptions(), prime, samples, seed });
    } catch (e) {
      return this.status(e.message, true);
    }
  }

  // The controls, checked: an Error with one line saying what to change.
  readOptions() {
    const h = this.model.header, value = (name) => this.$(name).value.trim();
    const number = (name, test, rule) => {
      const v = Number(value(name));
      if (value(name) === "" || !Number.isFinite(v) || !test(v)) throw new Error(`${name.replace("_", "-")} must be ${rule}, not "${value(name)}"`);
      return v;
    };
    const whole = (low, high) => (v) => Number.isInteger(v) && v >= low && v <= high;
    const options = {
      prime: this.$("prime").value,
      length: number("length", whole(1, h.limits.length), `a whole number from 1 to ${h.limits.length.toLocaleString("en")}`),
      temperature: number("temperature", (v) => v >= 0, "0 or more (0 is greedy)"),
      top_k: number("top_k", whole(0, Infinity), "0 (off) or a whole number"),
      top_p: number("top_p", (v) => v > 0 && v <= 1, "in (0, 1] (1 is off)"),
      samples: number("samples", whole(1, h.limits.samples), `a whole number from 1 to ${h.limits.samples}`),
      seed: value("seed") || String(crypto.getRandomValues(new Uint32Array(1))[0]),
    };
    if (!/^[0-9]+$/.test(options.seed) || BigInt(options.seed) > BigInt(h.limits.seed)) {
      throw new Error(`seed must be a whole number from 0 to ${h.limits.seed}, or empty for a random one`);
    }
    encodePrime(h, options.prime);  // (refused here, with the characters named)
    return options;
  }

  async run(options) {  // up to options.length steps, shown slice by slice
    Object.assign(this, { options, running: true, stop: false });
    this.buttons();
    this.status("sampling…");
    const n = options.samples, started = performance.now();
    let steps = 0, chars = 0, slice = 0;
    try {
      while (steps < options.length && !this.stop) {
        const pieces = new Array(n).fill(""), until = performance.now() + (slice++ ? SLICE_MS : 0);  // (the first character at once)
        do {
          const step = this.sampler.step(options);
          if (!step) { steps = options.length; break; }
          for (let j = 0; j < n; j++) pieces[j] += step[j];
          steps++;
        } while (steps < options.length && performance.now() < until);
        pieces.forEach((piece, j) => { chars += piece.length; if (piece) this.nodes[j].appendData(piece); });
        if (this.timings.firstChar === undefined && chars) this.timings.firstChar = performance.now();
        await nextTask();
      }
      const seconds = (performance.now() - started) / 1000;
      this.status(`${chars.toLocaleString("en")} characters in ${seconds.toFixed(2)} s `
        + `(${Math.round(chars / seconds).toLocaleString("en")} chars/s) · seed ${options.seed}${this.stop ? " · stopped" : ""}`);
      this.timings.rate = chars / seconds;
    } catch (e) {
      this.status(`chargen: ${e.message}`, true);
    }
    this.running = false;
    Object.assign(this.timings, { done: performance.now(), runs: (this.timings.runs || 0) + 1 });
    this.buttons();
  }
}

// The chargen command that draws the same text (with fp32 weights; MODEL_DIR: the model
// this page was exported from).
function command(header, o) {
  const quote = (s) => (/^[\w.,:/=+-]+$/.test(s) ? s : `'${s.replaceAll("'", "'\\''")}'`);
  const parts = ["chargen sample MODEL_DIR --rng portable", `--seed ${o.seed}`, `--length ${o.length}`,
    `--temperature ${o.temperature}`, `--top-k ${o.top_k}`, `--top-p ${o.top_p}`, `--num-samples ${o.samples}`];
  if (o.prime) parts.push(`--prime ${quote(o.prime)}`);
  return `The same text from Python${header.weights.dtype === "float32" ? "" : " (with fp32 weights; these are fp16)"}: ${parts.join(" ")}`;
}

let channel = null;
const waiting = [];
function nextTask() {  // yield to the browser (to paint, and to take clicks) without setTimeout's clamp
  if (!channel) {
    channel = new MessageChannel();
    channel.port1.onmessage = () => waiting.shift()();
  }
  return new Promise((resolve) => { waiting.push(resolve); channel.port2.postMessage(0); });
}

if (typeof document !== "undefined") document.addEventListener("DOMContentLoaded", () => new Page());
if (typeof module !== "undefined") module.exports = { PCG32, exp64, kernelModule, matvecJS, cell, Model, Sampler, pick, encodePrime, halfToFloat };
if (typeof window !== "undefined") window.chargen = { PCG32, Model, Sampler, loadModel, encodePrime };
