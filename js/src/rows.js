// The records of a run, held as columns (one array per Record field), appended live.
//
// Rows arrive as encoded column batches (onnx_sbs_nb/reports/view_state.py encode_rows):
// {n, data: [column per field]}, each column a plain array, {c: value} (all equal) or
// {d: distinct, k: codes}. Saved states of the first releases hold one array per row:
// both are read.
import { columnIndex, num } from "./util.js";
import { Schema } from "./schema.js";

/** The `n` values of one encoded column. */
export function decodeColumn(enc, n) {
  if (Array.isArray(enc)) return enc;
  if (enc && typeof enc === "object") {
    if ("c" in enc) return new Array(n).fill(enc.c);
    if (Array.isArray(enc.d) && Array.isArray(enc.k)) {
      const d = enc.d;
      return enc.k.map((k) => (k === null || k === undefined ? null : d[k]));
    }
  }
  return new Array(n).fill(null);
}

/** {n, cols} of a batch in either form, columns in `columns` order. */
function decodeBatch(batch, width) {
  if (Array.isArray(batch)) {
    const cols = [];
    for (let k = 0; k < width; k++) cols.push(batch.map((r) => (Array.isArray(r) ? r[k] : undefined)));
    return { n: batch.length, cols };
  }
  if (batch && typeof batch === "object" && Array.isArray(batch.data)) {
    const n = typeof batch.n === "number" ? batch.n : 0;
    return { n, cols: batch.data.map((c) => decodeColumn(c, n)) };
  }
  return { n: 0, cols: [] };
}

// Rows that are weights or constants: compared, summarised, listed on request.
const CONSTANT_OPS = new Set(["initializer", "Constant"]);

export class RowStore {
  /** `schema`: the state's `schema` (records.py FIELDS, STATUSES), or a Schema. */
  constructor(columns, rows, schema = null) {
    this.columns = columns || [];
    this.schema = schema instanceof Schema ? schema : new Schema(schema, this.columns);
    this.ci = columnIndex(this.columns);
    this.cols = this.columns.map(() => []);
    this.held = []; // true where row i arrived
    this.present = 0;
    if (rows) this.replace(rows);
  }

  /** One past the highest row index held (rows may have holes while streaming). */
  get length() {
    return this.held.length;
  }

  /** Rows actually held. */
  get count() {
    return this.present;
  }

  has(i) {
    return this.held[i] === true;
  }

  /** First missing row index (== length when there is no hole). */
  firstHole() {
    for (let i = 0; i < this.held.length; i++) if (!this.held[i]) return i;
    return this.held.length;
  }

  /** The values of a field (index = row), or null for a field this run does not have. */
  col(name) {
    const k = this.ci[name];
    return k === undefined ? null : this.cols[k];
  }

  get(i, name) {
    const k = this.ci[name];
    if (k === undefined) return undefined;
    const v = this.cols[k][i];
    return v === undefined ? null : v;
  }

  num(i, name) {
    return num(this.get(i, name));
  }

  _write(start, batch) {
    const { n, cols } = decodeBatch(batch, this.columns.length);
    let filled = false;
    const end = this.held.length;
    for (let k = 0; k < this.cols.length; k++) {
      const dst = this.cols[k];
      const src = cols[k] || [];
      for (let r = 0; r < n; r++) dst[start + r] = src[r];
    }
    for (let r = 0; r < n; r++) {
      const i = start + r;
      if (!this.held[i]) {
        if (i < end) filled = true;
        this.held[i] = true;
        this.present += 1;
      }
    }
    for (let i = end; i < start; i++) if (this.held[i] === undefined) this.held[i] = false;
    return { n, filled, end };
  }

  /**
   * Put a batch that starts at row `start`. Batches missed before the view listened
   * leave holes (filled later by a "hello" reply or the final full sync).
   * Returns "append" when rows were only added at the end, "fill" when earlier rows
   * changed (views must redo everything), "" when nothing changed.
   */
  put(start, batch) {
    const { n, filled, end } = this._write(start, batch);
    if (!n) return "";
    return filled ? "fill" : start + n > end ? "append" : "";
  }

  /** The full list (end of run, saved notebook): adopt it unless it holds fewer rows. */
  replace(rows) {
    const n = Array.isArray(rows) ? rows.length : rows && typeof rows.n === "number" ? rows.n : -1;
    if (n < 0 || n < this.present) return false;
    this.cols = this.columns.map(() => []);
    this.held = [];
    this.present = 0;
    this._write(0, rows);
    return true;
  }

  failed(i) {
    return this.schema.failing(this.get(i, "status"));
  }

  /** A weight or a constant (initializer, Constant node): shown folded by default. */
  isConstant(i) {
    return this.get(i, "kind") === "weight" || CONSTANT_OPS.has(this.get(i, "onnx_op_type"));
  }

  /** Row an action can target: an ONNX node output (not an input or an initializer). */
  isOnnxNode(i) {
    const name = this.get(i, "onnx_name");
    const id = this.get(i, "onnx_id_node");
    return !!name && id !== null && id !== undefined && id >= 0;
  }

  /** The name the user knows: their own fx node name, else the prepared one. */
  userName(i) {
    return this.get(i, "ep_user_name") || this.get(i, "ep_name") || "";
  }

  label(i) {
    return this.userName(i) || this.get(i, "onnx_name") || `row ${i}`;
  }

  /** The own error: the rerun on torch inputs when there is one. */
  ownError(i) {
    return this.num(i, "err_abs2");
  }

  /** Find a row from a summary entry ({step|row|onnx_name|ep_name}). */
  find(entry) {
    if (!entry || typeof entry !== "object") return -1;
    if (typeof entry.row === "number" && this.has(entry.row)) return entry.row;
    const match = (key, value) => {
      if (value === undefined || value === null) return -1;
      const col = this.col(key);
      if (!col) return -1;
      for (let i = 0; i < col.length; i++) if (this.held[i] && col[i] === value) return i;
      return -1;
    };
    for (const [key, value] of [
      ["step", entry.step],
      ["onnx_name", entry.onnx_name],
      ["onnx_name", entry.onnx_node],
      ["ep_name", entry.ep_name],
    ]) {
      const i = match(key, value);
      if (i >= 0) return i;
    }
    return -1;
  }
}
