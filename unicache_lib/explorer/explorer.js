// UniCache attention explorer: one ES module for both homes.
//  - In a notebook with a kernel it is an anywidget: render({model, el}) reads the spec (`_spec`) and the maps
//    (`_data`, bytes) from the widget's model and writes the reader's choices back to `selection`.
//  - Without a kernel (the widget's HTML form: an nbconvert export, the course site) the same render() runs on a
//    small model (get / set / on) built from the data inlined in the page.
// Everything the data carries (tokens, labels, titles, questions) is set with textContent or drawn with fillText:
// never parsed as markup. Nothing is fetched: the colour maps are below, the picture is decoded from the bytes.

const INFERNO = "00000401000501010601010802010a02020c02020e03021004031204031405041706041907051b08051d09061f0a07220b07240c08260d08290e092b10092d110a30120a32140b34150b37160b39180c3c190c3e1b0c411c0c431e0c451f0c48210c4a230c4c240c4f260c51280b53290b552b0b572d0b592f0a5b310a5c320a5e340a5f3609613809623909633b09643d09653e0966400a67420a68440a68450a69470b6a490b6a4a0c6b4c0c6b4d0d6c4f0d6c510e6c520e6d540f6d550f6d57106e59106e5a116e5c126e5d126e5f136e61136e62146e64156e65156e67166e69166e6a176e6c186e6d186e6f196e71196e721a6e741a6e751b6e771c6d781c6d7a1d6d7c1d6d7d1e6d7f1e6c801f6c82206c84206b85216b87216b88226a8a226a8c23698d23698f24699025689225689326679526679727669827669a28659b29649d29649f2a63a02a63a22b62a32c61a52c60a62d60a82e5fa92e5eab2f5ead305dae305cb0315bb1325ab3325ab43359b63458b73557b93556ba3655bc3754bd3853bf3952c03a51c13a50c33b4fc43c4ec63d4dc73e4cc83f4bca404acb4149cc4248ce4347cf4446d04545d24644d34743d44842d54a41d74b3fd84c3ed94d3dda4e3cdb503bdd513ade5238df5337e05536e15635e25734e35933e45a31e55c30e65d2fe75e2ee8602de9612bea632aeb6429eb6628ec6726ed6925ee6a24ef6c23ef6e21f06f20f1711ff1731df2741cf3761bf37819f47918f57b17f57d15f67e14f68013f78212f78410f8850ff8870ef8890cf98b0bf98c0af98e09fa9008fa9207fa9407fb9606fb9706fb9906fb9b06fb9d07fc9f07fca108fca309fca50afca60cfca80dfcaa0ffcac11fcae12fcb014fcb216fcb418fbb61afbb81dfbba1ffbbc21fbbe23fac026fac228fac42afac62df9c72ff9c932f9cb35f8cd37f8cf3af7d13df7d340f6d543f6d746f5d949f5db4cf4dd4ff4df53f4e156f3e35af3e55df2e661f2e865f2ea69f1ec6df1ed71f1ef75f1f179f2f27df2f482f3f586f3f68af4f88ef5f992f6fa96f8fb9af9fc9dfafda1fcffa4";
const VIRIDIS = "44015444025645045745055946075a46085c460a5d460b5e470d60470e6147106347116447136548146748166848176948186a481a6c481b6d481c6e481d6f481f70482071482173482374482475482576482677482878482979472a7a472c7a472d7b472e7c472f7d46307e46327e46337f463480453581453781453882443983443a83443b84433d84433e85423f854240864241864142874144874045884046883f47883f48893e49893e4a893e4c8a3d4d8a3d4e8a3c4f8a3c508b3b518b3b528b3a538b3a548c39558c39568c38588c38598c375a8c375b8d365c8d365d8d355e8d355f8d34608d34618d33628d33638d32648e32658e31668e31678e31688e30698e306a8e2f6b8e2f6c8e2e6d8e2e6e8e2e6f8e2d708e2d718e2c718e2c728e2c738e2b748e2b758e2a768e2a778e2a788e29798e297a8e297b8e287c8e287d8e277e8e277f8e27808e26818e26828e26828e25838e25848e25858e24868e24878e23888e23898e238a8d228b8d228c8d228d8d218e8d218f8d21908d21918c20928c20928c20938c1f948c1f958b1f968b1f978b1f988b1f998a1f9a8a1e9b8a1e9c891e9d891f9e891f9f881fa0881fa1881fa1871fa28720a38620a48621a58521a68522a78522a88423a98324aa8325ab8225ac8226ad8127ad8128ae8029af7f2ab07f2cb17e2db27d2eb37c2fb47c31b57b32b67a34b67935b77937b87838b9773aba763bbb753dbc743fbc7340bd7242be7144bf7046c06f48c16e4ac16d4cc26c4ec36b50c46a52c56954c56856c66758c7655ac8645cc8635ec96260ca6063cb5f65cb5e67cc5c69cd5b6ccd5a6ece5870cf5773d05675d05477d1537ad1517cd2507fd34e81d34d84d44b86d54989d5488bd6468ed64590d74393d74195d84098d83e9bd93c9dd93ba0da39a2da37a5db36a8db34aadc32addc30b0dd2fb2dd2db5de2bb8de29bade28bddf26c0df25c2df23c5e021c8e020cae11fcde11dd0e11cd2e21bd5e21ad8e219dae319dde318dfe318e2e418e5e419e7e419eae51aece51befe51cf1e51df4e61ef6e620f8e621fbe723fde725";
const CSS = `
.ucx-root{font:12px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--jp-ui-font-color1,#222);max-width:660px}
.ucx-controls{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center;margin:4px 0}
.ucx-control{display:inline-flex;align-items:center;gap:4px;white-space:nowrap}
.ucx-control input[type=range]{width:150px}
.ucx-readout{display:inline-block;min-width:3.2em;font-family:ui-monospace,monospace;max-width:16em;overflow:hidden;
  text-overflow:ellipsis;vertical-align:bottom}
.ucx-caption{margin:2px 0 4px}
.ucx-canvas{display:block;border:1px solid #ddd;max-width:100%}
.ucx-buttons{display:flex;gap:6px;margin-top:4px}
.ucx-buttons button{font:inherit;padding:1px 8px}
`;

function hexBytes(hex) {
  const a = new Uint8Array(hex.length / 2);
  for (let i = 0; i < a.length; i++) a[i] = parseInt(hex.substr(2 * i, 2), 16);
  return a;
}
const LUTS = { inferno: hexBytes(INFERNO), viridis: hexBytes(VIRIDIS) };

function bytesOf(v) {
  if (v instanceof Uint8Array) return v;
  if (v instanceof DataView) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  if (v && v.buffer instanceof ArrayBuffer) return new Uint8Array(v.buffer, v.byteOffset || 0, v.byteLength);
  throw new Error("unicache explorer: no map data");
}

function make(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function fmt(x) {
  if (!isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 0.01 || a >= 10000)) return x.toExponential(1);
  return a >= 100 ? x.toFixed(0) : a >= 10 ? x.toFixed(1) : x.toFixed(2);
}

const W = 520, H = 440, BOX = 380, X0 = 8, Y0 = 30, BAR_X = X0 + BOX + 16, BAR_W = 14;

class Explorer {
  constructor(model, el, data) {
    this.model = model;
    this.el = el;
    this.spec = model.get("_spec");
    this.bytes = bytesOf(data);
    this.floatCache = new Map();
    this.images = new Map();
    this.sel = Object.assign({ model: 0, sample: 0, view: null, axes: [], head: 0, word: 0 },
                             this.spec.open || {}, model.get("selection") || {});
    this.lastMs = 0;
    this.build();
    this.onModel = () => {
      const s = model.get("selection") || {};
      if (JSON.stringify(s) === JSON.stringify(this.sel)) return;
      Object.assign(this.sel, s);
      this.controls();
      this.draw();
    };
    model.on("change:selection", this.onModel);
    this.controls();
    this.draw();
  }

  destroy() {
    if (this.model.off) this.model.off("change:selection", this.onModel);
  }

  // ---------------------------------------------------------------------------------------------- data access
  panel() { return this.spec.models[this.sel.model].panels[this.sel.sample]; }
  frameIndex(p) {
    let f = 0;
    p.axes.forEach((a, i) => { f = f * a.values.length + this.sel.axes[i]; });
    return f;
  }
  floats(off, n) {
    let a = this.floatCache.get(off);
    if (!a) {
      a = new Float32Array(this.bytes.slice(off, off + 4 * n).buffer);
      this.floatCache.set(off, a);
    }
    return a;
  }
  frames(p) { return p.axes.reduce((n, a) => n * a.values.length, 1); }
  heads(p) { return this.sel.head >= p.heads ? [...Array(p.heads).keys()] : [this.sel.head]; }

  overlay(p, view) {  // Float32Array over the grid's cells, in multiples of the uniform weight; null: nothing here
    const e = p[view];
    const wi = view === "t2i" ? this.sel.word : p.i2t_words.indexOf(this.sel.word);
    if (!e || wi < 0) return null;
    const C = p.grid[0] * p.grid[1], F = this.frames(p), f = this.frameIndex(p);
    const scales = this.floats(e.soff, F * p.heads * e.words);
    const hs = this.heads(p), out = new Float32Array(C), b = this.bytes;
    for (const h of hs) {
      const idx = (f * p.heads + h) * e.words + wi, s = scales[idx] / 255 / hs.length, base = e.off + idx * C;
      for (let c = 0; c < C; c++) out[c] += b[base + c] * s;
    }
    return out;
  }

  fullMap(p) {  // Float32Array rows x cols of weights (block means when pooled)
    const e = p.full, F = this.frames(p), f = this.frameIndex(p), n = e.rows, m = e.cols;
    const lohi = this.floats(e.soff, F * p.heads * 2), hs = this.heads(p), out = new Float32Array(n * m);
    const lut = new Float32Array(256), b = this.bytes;
    for (const h of hs) {
      const idx = f * p.heads + h, lo = lohi[2 * idx], hi = lohi[2 * idx + 1], base = e.off + idx * e.cells;
      lut[0] = 0;
      for (let q = 1; q < 256; q++) lut[q] = Math.pow(10, lo + (q - 1) / 254 * (hi - lo)) / hs.length;
      if (e.tri) {
        let c = base;
        for (let i = 0; i < n; i++) for (let j = 0; j <= i; j++) out[i * m + j] += lut[b[c++]];
      } else {
        for (let c = 0; c < e.cells; c++) out[c] += lut[b[base + c]];
      }
    }
    return out;
  }

  picture(p) {  // an ImageBitmap, or null while it decodes (a redraw follows)
    const key = this.sel.model + "/" + this.sel.sample;
    const have = this.images.get(key);
    if (have && have !== "pending") return have;
    if (!have) {
      this.images.set(key, "pending");
      const im = p.image, blob = new Blob([this.bytes.subarray(im.off, im.off + im.len)], { type: im.mime });
      createImageBitmap(blob).then((bmp) => { this.images.set(key, bmp); this.draw(); },
                                   () => { this.images.set(key, "failed"); });
    }
    return null;
  }

  // ---------------------------------------------------------------------------------------------- the page
  build() {
    const root = make("div", "ucx-root");
    const style = make("style");
    style.textContent = CSS;
    root.appendChild(style);
    if (this.spec.title) root.appendChild(make("div", "ucx-title", this.spec.title)).style.fontWeight = "bold";
    this.controlBox = root.appendChild(make("div", "ucx-controls"));
    this.caption = root.appendChild(make("div", "ucx-caption"));
    this.canvas = root.appendChild(make("canvas", "ucx-canvas"));
    const dpr = Math.max(1, Math.min(3, window.devicePixelRatio || 1));
    this.dpr = dpr;
    this.canvas.width = W * dpr;
    this.canvas.height = H * dpr;
    this.canvas.style.width = W + "px";
    this.canvas.setAttribute("role", "img");
    const buttons = root.appendChild(make("div", "ucx-buttons"));
    const png = buttons.appendChild(make("button", "ucx-save-png", "Save view (PNG)"));
    const json = buttons.appendChild(make("button", "ucx-save-json", "Save numbers (JSON)"));
    png.type = json.type = "button";
    png.addEventListener("click", () => this.savePng());
    json.addEventListener("click", () => this.saveJson());
    // keys pressed on a control are the control's: not JupyterLab's shortcuts (its notebook takes the arrows)
    root.addEventListener("keydown", (e) => e.stopPropagation());
    this.el.appendChild(root);
    this.root = root;
  }

  slider(name, n, value, label, onInput) {
    const wrap = make("label", "ucx-control");
    wrap.appendChild(make("span", "ucx-name", name));
    const r = make("input", "ucx-range");
    r.type = "range";
    r.min = "0";
    r.max = String(Math.max(0, n - 1));
    r.step = "1";
    r.value = String(value);
    r.dataset.name = name;
    r.setAttribute("aria-label", name);
    const out = make("output", "ucx-readout", label(value));
    r.addEventListener("input", () => { onInput(+r.value); out.textContent = label(+r.value); this.draw(); });
    r.addEventListener("change", () => this.push());
    wrap.append(r, out);
    if (n < 2) r.disabled = true;
    this.controlBox.appendChild(wrap);
    return r;
  }

  select(name, options, value, onChange) {
    const wrap = make("label", "ucx-control");
    wrap.appendChild(make("span", "ucx-name", name));
    const s = make("select", "ucx-select");
    s.dataset.name = name;
    options.forEach((o, i) => { const opt = make("option", null, o); opt.value = String(i); s.appendChild(opt); });
    s.value = String(value);
    s.addEventListener("change", () => { onChange(+s.value); this.controls(); this.draw(); this.push(); });
    wrap.appendChild(s);
    this.controlBox.appendChild(wrap);
    return s;
  }

  clamp() {
    const ms = this.spec.models;
    this.sel.model = Math.min(Math.max(0, this.sel.model | 0), ms.length - 1);
    const ps = ms[this.sel.model].panels;
    this.sel.sample = Math.min(Math.max(0, this.sel.sample | 0), ps.length - 1);
    const p = this.panel();
    if (!Array.isArray(this.sel.axes) || this.sel.axes.length !== p.axes.length) this.sel.axes = p.axes.map(() => 0);
    this.sel.axes = this.sel.axes.map((v, i) => Math.min(Math.max(0, v | 0), p.axes[i].values.length - 1));
    this.sel.head = Math.min(Math.max(0, this.sel.head | 0), p.heads);
    if (!(this.sel.word >= 0 && this.sel.word < p.words.length)) this.sel.word = p.open_word;
    if (!p.views.includes(this.sel.view)) this.sel.view = p.views[0];
  }

  controls() {
    this.clamp();
    this.controlBox.replaceChildren();
    const ms = this.spec.models, p = this.panel();
    if (ms.length > 1) this.select("model", ms.map((m) => m.label), this.sel.model, (i) => {
      this.sel.model = i; this.sel.sample = 0; this.sel.word = -1; this.sel.axes = [];
    });
    const ps = ms[this.sel.model].panels;
    if (ps.length > 1) this.select(this.spec.kind === "steps" ? "prompt" : "sample", ps.map((q) => q.sample),
                                   this.sel.sample, (i) => { this.sel.sample = i; this.sel.word = -1; });
    this.select("view", p.views.map((v) => this.spec.view_names[v]), p.views.indexOf(this.sel.view),
                (i) => { this.sel.view = p.views[i]; });
    p.axes.forEach((a, i) => this.slider(a.name, a.values.length, this.sel.axes[i], (v) => String(a.values[v]),
                                         (v) => { this.sel.axes[i] = v; }));
    this.slider("head", p.heads + 1, this.sel.head, (v) => (v >= p.heads ? "mean" : String(v)),
                (v) => { this.sel.head = v; });
    this.slider(this.spec.kind === "steps" ? "word" : "query token", p.words.length, this.sel.word,
                (v) => p.words[v], (v) => { this.sel.word = v; });
  }

  push() {
    try {
      this.model.set("selection", Object.assign({}, this.sel, { axes: this.sel.axes.slice() }));
      this.model.save_changes();
    } catch (e) { /* a page without a kernel keeps its choices to itself */ }
  }

  // ---------------------------------------------------------------------------------------------- drawing
  settings(p) {
    const s = { model: this.spec.models[this.sel.model].label, sample: p.sample, view: this.sel.view };
    p.axes.forEach((a, i) => { s[a.name] = a.values[this.sel.axes[i]]; });
    s.head = this.sel.head >= p.heads ? "mean" : this.sel.head;
    s.word = p.words[this.sel.word];
    return s;
  }

  captionText(p, peak) {
    const s = this.settings(p), parts = [];
    if (this.spec.models.length > 1) parts.push(s.model);
    parts.push((this.spec.kind === "steps" ? "prompt " : "sample ") + p.sample);
    p.axes.forEach((a) => parts.push(a.name + " " + s[a.name]));
    parts.push(s.head === "mean" ? "mean of " + p.heads + " heads" : "head " + s.head);
    if (p.note) parts.push(p.note_name + ": " + p.note);
    parts.push((this.spec.kind === "steps" ? "word: " : "query token: ") + s.word);
    if (peak !== null) parts.push("peak " + fmt(peak) + "× uniform");
    return parts.join(" · ");
  }

  draw() {
    const t0 = performance.now();
    this.clamp();
    const p = this.panel(), ctx = this.canvas.getContext("2d"), d = this.dpr;
    ctx.setTransform(d, 0, 0, d, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, W, H);
    const scale = this.spec.models[this.sel.model].scale, view = this.sel.view, word = p.words[this.sel.word];
    const where = p.axes.map((a, i) => a.name + " " + a.values[this.sel.axes[i]]).join(" · ") + " · " +
      (this.sel.head >= p.heads ? "mean of heads" : "head " + this.sel.head);
    let peak = null;
    if (view === "full") {
      const m = this.fullMap(p);
      this.drawFull(ctx, p, m, scale.full);
      this.title(ctx, where + " · the whole map, image keys outlined, " + word + " marked");
      this.current = { kind: "full", values: m, rows: p.full.rows, cols: p.full.cols };
    } else {
      const blind = view === "t2i" ? p.t2i_blind.includes(this.sel.word) : !p.i2t_words.includes(this.sel.word);
      const v = blind ? null : this.overlay(p, view), vmax = Math.max(1, scale[view]);
      const what = view === "t2i" ? word + " reading the picture" : "the picture reading " + word;
      this.title(ctx, where + " · " + what + " (× uniform)");
      if (v) peak = v.reduce((a, b) => Math.max(a, b), 0);
      this.drawOverlay(ctx, p, v, vmax, view);
      this.current = { kind: view, values: v, rows: p.grid[0], cols: p.grid[1] };
    }
    this.caption.textContent = this.captionText(p, peak);
    this.canvas.setAttribute("aria-label", this.caption.textContent);
    this.lastMs = performance.now() - t0;
    this.el.dataset.redrawMs = this.lastMs.toFixed(2);
    this.el.dataset.draws = String((+this.el.dataset.draws || 0) + 1);
    return this.lastMs;
  }

  title(ctx, text) {
    ctx.fillStyle = "#222";
    ctx.font = "bold 12px system-ui,sans-serif";
    ctx.textBaseline = "middle";
    let t = text;
    while (t.length > 4 && ctx.measureText(t).width > W - 12) t = t.slice(0, -2);
    if (t !== text) t = t.slice(0, -1) + "…";
    ctx.fillText(t, X0, 14);
  }

  heat(cols, rows, values, colour) {  // a cols x rows canvas of colours; colour(v) -> [r, g, b, a]
    if (!this.off || this.off.width !== cols || this.off.height !== rows) {
      this.off = document.createElement("canvas");
      this.off.width = cols;
      this.off.height = rows;
      this.offImage = this.off.getContext("2d").createImageData(cols, rows);
    }
    const c = this.off.getContext("2d"), img = this.offImage, px = img.data;
    for (let i = 0; i < rows * cols; i++) {
      const [r, g, b, a] = colour(values ? values[i] : NaN);
      px[4 * i] = r; px[4 * i + 1] = g; px[4 * i + 2] = b; px[4 * i + 3] = a;
    }
    c.putImageData(img, 0, 0);
    return this.off;
  }

  drawOverlay(ctx, p, v, vmax, view) {
    const bmp = this.picture(p), im = p.image;
    const r = Math.min(BOX / im.width, BOX / im.height), w = im.width * r, h = im.height * r;
    const x = X0 + (BOX - w) / 2, y = Y0 + (BOX - h) / 2;
    if (bmp && bmp !== "failed") {
      ctx.imageSmoothingEnabled = true;
      ctx.drawImage(bmp, x, y, w, h);
    } else {
      ctx.fillStyle = "#ccc";
      ctx.fillRect(x, y, w, h);
    }
    const lut = LUTS.inferno;
    if (v) {
      const off = this.heat(p.grid[1], p.grid[0], v, (val) => {
        const k = Math.max(0, Math.min(255, Math.round(val / vmax * 255)));
        return [lut[3 * k], lut[3 * k + 1], lut[3 * k + 2], 153];
      });
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, x, y, w, h);
    } else {
      ctx.fillStyle = "rgba(255,255,255,0.75)";
      ctx.fillRect(x, y, w, h);
      ctx.fillStyle = "#222";
      ctx.font = "12px system-ui,sans-serif";
      const [a, b] = view === "t2i" ? ["this word cannot see the picture", "(it comes before it: causal mask)"]
        : ["no image token can see this word", "(it comes after the picture: causal mask)"];
      ctx.fillText(a, x + 8, y + h / 2 - 8);
      ctx.fillText(b, x + 8, y + h / 2 + 8);
    }
    ctx.strokeStyle = "#999";
    ctx.lineWidth = 1;
    ctx.strokeRect(x + 0.5, y + 0.5, w - 1, h - 1);
    const ticks = [[1, "1 = even"], [0, "0"]];  // first come, first drawn: a tick too close to one drawn is left out
    if (vmax > 1.15) ticks.unshift([vmax, fmt(vmax) + "×"]);
    this.colourBar(ctx, lut, 0, vmax, ticks, 1, "× uniform (one scale for this view)");
  }

  drawFull(ctx, p, m, range) {
    const e = p.full, [lo, hi] = range, span = hi > lo ? hi - lo : 1, lut = LUTS.viridis;
    const off = this.heat(e.cols, e.rows, m, (val) => {
      if (!(val > 0)) return [240, 240, 240, 255];
      const k = Math.max(0, Math.min(255, Math.round((Math.log10(val) - lo) / span * 255)));
      return [lut[3 * k], lut[3 * k + 1], lut[3 * k + 2], 255];
    });
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, X0, Y0, BOX, BOX);
    const sx = BOX / e.cols, sy = BOX / e.rows, k = e.k;
    ctx.strokeStyle = "red";
    ctx.lineWidth = 1.5;
    if (p.key_band) {  // the image keys: a band of columns
      const a = p.key_band[0] / k, b = p.key_band[1] / k;
      ctx.strokeRect(X0 + a * sx, Y0, (b - a) * sx, BOX);
    }
    if (p.query_band && p.part !== "cross") {  // and their rows, dashed
      const a = p.query_band[0] / k, b = p.query_band[1] / k;
      ctx.setLineDash([4, 3]);
      ctx.strokeRect(X0, Y0 + a * sy, BOX, (b - a) * sy);
      ctx.setLineDash([]);
    }
    // the word: its row (as a query) and its column (as a key), marked on the edges
    ctx.fillStyle = "#00bcd4";
    const row = p.rows ? p.rows[this.sel.word] : null;
    const col = p.cols && p.i2t_words.includes(this.sel.word) ? p.cols[this.sel.word] : null;
    if (row !== null) ctx.fillRect(X0 - 6, Y0 + Math.floor(row / k) * sy, 5, Math.max(2, sy));
    if (col !== null) ctx.fillRect(X0 + Math.floor(col / k) * sx, Y0 + BOX + 1, Math.max(2, sx), 5);
    ctx.fillStyle = "#444";
    ctx.font = "11px system-ui,sans-serif";
    ctx.fillText("keys →" + (k > 1 ? "  (blocks of " + k + " × " + k + " positions, averaged)" : ""), X0, Y0 + BOX + 16);
    const ticks = [];
    for (let t = Math.ceil(lo); t <= Math.floor(hi); t++) ticks.push([t, "1e" + t]);
    this.colourBar(ctx, lut, lo, hi, ticks, null, "log10 weight (grey: 0, not visible)");
  }

  colourBar(ctx, lut, lo, hi, ticks, chance, label) {
    const x = BAR_X, y = Y0, h = BOX;
    this.bars = this.bars || new Map();
    let bar = this.bars.get(lut);
    if (!bar) {  // the colour map, top = 255, drawn once
      bar = document.createElement("canvas");
      bar.width = 1;
      bar.height = 256;
      const c = bar.getContext("2d"), img = c.createImageData(1, 256);
      for (let i = 0; i < 256; i++) {
        const k = 255 - i;
        img.data.set([lut[3 * k], lut[3 * k + 1], lut[3 * k + 2], 255], 4 * i);
      }
      c.putImageData(img, 0, 0);
      this.bars.set(lut, bar);
    }
    ctx.imageSmoothingEnabled = true;
    ctx.drawImage(bar, x, y, BAR_W, h);
    ctx.strokeStyle = "#888";
    ctx.lineWidth = 1;
    ctx.strokeRect(x + 0.5, y + 0.5, BAR_W - 1, h - 1);
    ctx.fillStyle = "#222";
    ctx.font = "10px system-ui,sans-serif";
    const at = (t) => y + (1 - (t - lo) / (hi > lo ? hi - lo : 1)) * (h - 1), drawn = [];
    for (const [t, text] of ticks) {
      if (t < lo - 1e-9 || t > hi + 1e-9) continue;
      const ty = Math.min(y + h - 4, Math.max(y + 5, at(t)));
      if (drawn.some((d) => Math.abs(d - ty) < 11)) continue;
      drawn.push(ty);
      ctx.fillRect(x + BAR_W, at(t), 3, 1);
      ctx.fillText(text, x + BAR_W + 5, ty);
    }
    if (chance !== null) {
      ctx.fillStyle = "cyan";
      ctx.fillRect(x - 3, at(chance) - 1, BAR_W + 6, 2);
    }
    ctx.save();
    ctx.translate(W - 8, y + h / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "center";
    ctx.fillStyle = "#444";
    ctx.fillText(label, 0, 0);
    ctx.restore();
  }

  // ---------------------------------------------------------------------------------------------- export
  fileName(ext) {
    const p = this.panel(), s = this.settings(p);
    const parts = ["ucx", this.spec.models.length > 1 ? s.model : null, p.sample, s.view,
                   ...p.axes.map((a) => a.name + s[a.name]), "head" + s.head, "word" + this.sel.word];
    return parts.filter((x) => x !== null).join("-").replace(/[^A-Za-z0-9._-]+/g, "_").slice(0, 120) + "." + ext;
  }

  download(blob, name) {
    const url = URL.createObjectURL(blob), a = document.createElement("a");
    a.href = url;
    a.download = name;
    a.style.display = "none";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 2000);
  }

  savePng() {
    this.canvas.toBlob((b) => { if (b) this.download(b, this.fileName("png")); }, "image/png");
  }

  numbers() {
    const p = this.panel(), c = this.current, rows = [];
    if (c.values) for (let i = 0; i < c.rows; i++) rows.push(Array.from(c.values.slice(i * c.cols, (i + 1) * c.cols),
                                                                      (x) => +x.toPrecision(4)));
    const scale = this.spec.models[this.sel.model].scale;
    return {
      explorer: this.spec.title, settings: this.settings(p), view: this.spec.view_names[c.kind],
      unit: c.kind === "full" ? "attention weight" : "multiples of the uniform weight (1 = even reading)",
      shape: [c.rows, c.cols],
      layout: c.kind === "full"
        ? { rows: "query positions", cols: "key positions", block: p.full.k, image_keys: p.key_band,
            image_queries: p.query_band }
        : { rows: "patch rows of the picture", cols: "patch columns", grid: p.grid },
      map: c.values ? rows : null,
      colour_scale: c.kind === "full" ? { log10: scale.full } : { from: 0, to: Math.max(1, scale[c.kind]), chance: 1 },
      words: p.words,
      note: "dequantised from one byte a value (3 significant digits at best); explorer.save() in Python writes the exact maps",
    };
  }

  saveJson() {
    const text = JSON.stringify(this.numbers(), null, 1);
    this.download(new Blob([text], { type: "application/json" }), this.fileName("json"));
  }
}

// the maps: inline (the HTML form), or asked of the kernel once when the view opens (the widget: one message, the
// blob as its binary buffer; they are not widget state, so a saved notebook holds them once)
function maps(model, el) {
  const have = model.get("_data");
  if (have && have.byteLength) return Promise.resolve(have);
  el.textContent = "The explorer's maps come from the kernel: run the cell that shows it.";
  return new Promise((resolve) => {
    const on = (msg, buffers) => {
      if (msg && msg.type === "ucx-data" && buffers && buffers.length) {
        model.off("msg:custom", on);
        el.textContent = "";
        resolve(buffers[0]);
      }
    };
    model.on("msg:custom", on);
    model.send({ type: "ucx-data" });
  });
}

async function render({ model, el }) {
  el.classList.add("ucx-mount");
  const ex = new Explorer(model, el, await maps(model, el));
  el.ucxExplorer = ex;
  return () => ex.destroy();
}

export default { render };
