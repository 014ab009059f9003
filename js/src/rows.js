// The records of a run as row arrays (one per Record, in `columns` order), appended live.
import { columnIndex, num, FAILING } from "./util.js";

export class RowStore {
  constructor(columns, rows) {
    this.columns = columns || [];
    this.ci = columnIndex(this.columns);
    this.rows = Array.isArray(rows) ? rows.slice() : [];
  }

  get length() {
    return this.rows.length;
  }

  get(i, name) {
    const k = this.ci[name];
    const r = this.rows[i];
    return k === undefined || !r ? undefined : r[k];
  }

  num(i, name) {
    return num(this.get(i, name));
  }

  /** Append a batch that starts at row `start`. Returns false on a gap (rows missed). */
  append(start, rows) {
    if (start > this.rows.length) return false;
    const skip = this.rows.length - start; // overlap with what we already have
    for (let k = skip; k < rows.length; k++) this.rows.push(rows[k]);
    return true;
  }

  /** The full list (end of run, saved notebook): adopt it unless it is behind us. */
  replace(rows) {
    if (!Array.isArray(rows) || rows.length < this.rows.length) return false;
    this.rows = rows.slice();
    return true;
  }

  failed(i) {
    return FAILING.has(this.get(i, "status"));
  }

  /** Row an action can target: an ONNX node output (not an input or an initializer). */
  isOnnxNode(i) {
    const name = this.get(i, "onnx_name");
    const id = this.get(i, "onnx_id_node");
    return !!name && id !== null && id !== undefined && id >= 0;
  }

  label(i) {
    return this.get(i, "onnx_name") || this.get(i, "ep_name") || `row ${i}`;
  }

  /** Find a row from a summary entry ({step|row|onnx_name|ep_name}). */
  find(entry) {
    if (!entry || typeof entry !== "object") return -1;
    if (typeof entry.row === "number" && entry.row < this.rows.length) return entry.row;
    const match = (key) => {
      if (entry[key] === undefined || entry[key] === null) return -1;
      for (let i = 0; i < this.rows.length; i++) if (this.get(i, key) === entry[key]) return i;
      return -1;
    };
    for (const key of ["step", "onnx_name", "ep_name"]) {
      const i = match(key);
      if (i >= 0) return i;
    }
    return -1;
  }
}
