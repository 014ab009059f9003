// The records of a run as row arrays (one per Record, in `columns` order), appended live.
import { columnIndex, num, FAILING } from "./util.js";

export class RowStore {
  constructor(columns, rows) {
    this.columns = columns || [];
    this.ci = columnIndex(this.columns);
    this.rows = Array.isArray(rows) ? rows.slice() : [];
    this.present = this.rows.length;
  }

  /** One past the highest row index held (rows may have holes while streaming). */
  get length() {
    return this.rows.length;
  }

  /** Rows actually held. */
  get count() {
    return this.present;
  }

  has(i) {
    return this.rows[i] !== undefined;
  }

  /** First missing row index (== length when there is no hole). */
  firstHole() {
    for (let i = 0; i < this.rows.length; i++) if (this.rows[i] === undefined) return i;
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

  /**
   * Put a batch that starts at row `start`. Batches missed before the view listened
   * leave holes (filled later by a "hello" reply or the final full sync).
   * Returns "append" when rows were only added at the end, "fill" when earlier rows
   * changed (views must redo everything), "" when nothing changed.
   */
  put(start, rows) {
    if (!rows.length) return "";
    const end = this.rows.length;
    let filled = false;
    for (let k = 0; k < rows.length; k++) {
      const i = start + k;
      if (i < end) {
        if (this.rows[i] === undefined) {
          filled = true;
          this.present += 1;
        }
        this.rows[i] = rows[k];
      } else {
        this.rows[i] = rows[k];
        this.present += 1;
      }
    }
    return filled ? "fill" : start + rows.length > end ? "append" : "";
  }

  /** The full list (end of run, saved notebook): adopt it unless it holds fewer rows. */
  replace(rows) {
    if (!Array.isArray(rows) || rows.length < this.present) return false;
    this.rows = rows.slice();
    this.present = rows.length;
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
      for (let i = 0; i < this.rows.length; i++) if (this.has(i) && this.get(i, key) === entry[key]) return i;
      return -1;
    };
    for (const key of ["step", "onnx_name", "ep_name"]) {
      const i = match(key);
      if (i >= 0) return i;
    }
    return -1;
  }
}
