// The record schema: which fields a record has, how each is labelled and formatted, which
// show as table columns first, and what each status means (is it failing, its colour).
// It is declared once, in Python (onnx_sbs_nb/records.py FIELDS and STATUSES), and comes
// with the state (`schema`); every view here derives from it and names no status itself.
import { fmtNum, num } from "./util.js";

/**
 * One Record field (records.py FieldSpec).
 * @typedef {Object} FieldSpec
 * @property {string} name       the Record field
 * @property {string} label      its name for a reader (detail panel, report headers)
 * @property {string|null} short the table header, when shorter than `label`
 * @property {"text"|"num"|"int"|"bool"|"pass"|"seconds"|"status"|"map"} fmt
 * @property {number|null} priority  table column kept in this order as the width shrinks
 *                                   (0: always shown; null: no column)
 * @property {number|null} width     the column's least width in px
 */

/**
 * One value of Record.status (records.py StatusSpec).
 * @typedef {Object} StatusSpec
 * @property {string} name
 * @property {string} label
 * @property {boolean} failing   counts as a failure (filters, red rows, graph, summary)
 * @property {"good"|"bad"|"warn"|"muted"} tone  its colour (CSS class sbs-tone-<tone>)
 * @property {boolean} compared  the two values were compared
 * @property {boolean} own       a failure of the node itself, even without a rerun
 * @property {boolean} judged_elsewhere  its `passed` flag is not its own verdict
 * @property {string|null} group statuses a filter offers as one choice
 * @property {string} doc        one sentence for a reader
 */

/**
 * The `schema` state key.
 * @typedef {Object} SchemaState
 * @property {FieldSpec[]} fields      in the order views list them
 * @property {StatusSpec[]} statuses   in the order views list them
 */

/**
 * The state a view renders: the widget's synced traits (onnx_sbs_nb/reports/view_state.py
 * STATE_TRAITS), or the same keys in a plain object (renderStatic). Documented field by
 * field at the top of index.js.
 * @typedef {Object} WidgetState
 * @property {SchemaState} schema
 * @property {string[]} columns
 * @property {{n: number, data: Array<any>}|Array<Array<any>>} rows
 * @property {Object} graph
 * @property {Object} status
 * @property {Object|null} summary
 * @property {number|null} atol
 * @property {number|null} rtol
 * @property {number} selected
 * @property {Object} details
 * @property {string} device
 * @property {boolean} cuda_available
 * @property {string} cuda_reason
 */

const PASS = { true: "pass", false: "fail" };

export class Schema {
  /**
   * @param {SchemaState|null|undefined} raw  the state's `schema`
   * @param {string[]} columns  the state's `columns` (a state saved before the schema
   *   travelled with it: every column, labelled by its name, no status known)
   */
  constructor(raw, columns = []) {
    const fields = raw && Array.isArray(raw.fields) ? raw.fields : columns.map((name) => ({ name, label: name, fmt: "text", priority: null }));
    /** @type {FieldSpec[]} */
    this.fields = fields;
    /** @type {StatusSpec[]} */
    this.statuses = raw && Array.isArray(raw.statuses) ? raw.statuses : [];
    this.byField = new Map(this.fields.map((f) => [f.name, f]));
    this.byStatus = new Map(this.statuses.map((s) => [s.name, s]));
  }

  /** @returns {FieldSpec|null} */
  field(name) {
    return this.byField.get(name) || null;
  }

  /** @returns {StatusSpec|null} */
  status(name) {
    return this.byStatus.get(name) || null;
  }

  label(name, short = false) {
    const f = this.field(name);
    if (!f) return name;
    return (short && f.short) || f.label || name;
  }

  failing(status) {
    const s = this.status(status);
    return !!(s && s.failing);
  }

  /** A failure of the node itself with no rerun needed (it failed to run). */
  own(status) {
    const s = this.status(status);
    return !!(s && s.own);
  }

  tone(status) {
    const s = this.status(status);
    return (s && s.tone) || "muted";
  }

  statusLabel(status) {
    const s = this.status(status);
    return (s && s.label) || status || "";
  }

  /** The table's columns: fields with a priority, in schema order. */
  columns() {
    return this.fields.filter((f) => f.priority !== null && f.priority !== undefined);
  }

  /** A value as text, by the field's format. */
  format(name, v) {
    const f = this.field(name);
    if (v === null || v === undefined) return "";
    switch (f ? f.fmt : "text") {
      case "num":
        return fmtNum(v);
      case "bool":
        return v ? "yes" : "";
      case "pass":
        return PASS[String(v)] ?? "";
      case "seconds": {
        const x = num(v);
        return x === null ? "" : `${(x * 1000).toFixed(3)} ms`;
      }
      case "status":
        return this.statusLabel(v);
      case "map":
        return typeof v === "object"
          ? Object.entries(v).map(([k, x]) => `${k}=${typeof x === "number" ? fmtNum(x) : String(x)}`).join(", ")
          : String(v);
      default:
        return String(v);
    }
  }

  /** The choices of a verdict filter: statuses of one group as one choice. */
  verdictChoices() {
    const out = [];
    const seen = new Set();
    for (const s of this.statuses) {
      const value = s.group || s.name;
      if (seen.has(value)) continue;
      seen.add(value);
      out.push([value, s.group || s.label]);
    }
    return out;
  }

  /** Whether a status passes a verdict filter choice (a status or a group). */
  matches(status, choice) {
    if (status === choice) return true;
    const s = this.status(status);
    return !!(s && s.group && s.group === choice);
  }
}
