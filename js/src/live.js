// The rows of a live widget model, kept once per model (not per view) from the moment the
// module is loaded (anywidget `initialize`), so batches streamed before a view renders
// are not lost; a view that starts late still asks the kernel for what it missed.
import { RowStore } from "./rows.js";

const FEEDS = new Map(); // model uid -> LiveFeed

export class LiveFeed {
  constructor(model) {
    this.model = model;
    this.store = new RowStore(model.get("columns"), model.get("rows"), model.get("schema"));
    this.subs = new Set();
    // filters/sort/scroll of the last view: JupyterLab re-creates the view when the
    // display is updated at the end of the run, and the user keeps what they set
    this.viewState = {};
    this._onCustom = (msg) => this._custom(msg);
    this._onRows = () => {
      if (this.store.replace(this.model.get("rows"))) this._emit("reset", 0);
    };
    model.on("msg:custom", this._onCustom);
    model.on("change:rows", this._onRows);
  }

  _custom(msg) {
    if (!msg || msg.type !== "rows" || !msg.rows || typeof msg.start !== "number") return;
    const before = this.store.length;
    const hadHole = msg.start > before;
    const what = this.store.put(msg.start, msg.rows);
    if (what === "append") this._emit(hadHole ? "reset" : "append", before);
    else if (what === "fill") this._emit("reset", 0);
    if (hadHole) this.requestMissing();
  }

  /** Ask the kernel for every row from the first one we lack (answered when it is idle). */
  requestMissing() {
    this.model.send({ type: "hello", have: this.store.firstHole() });
  }

  _emit(kind, from) {
    for (const cb of this.subs) cb(kind, from);
  }

  subscribe(cb) {
    this.subs.add(cb);
    return () => this.subs.delete(cb);
  }

  destroy() {
    this.model.off("msg:custom", this._onCustom);
    this.model.off("change:rows", this._onRows);
    this.subs.clear();
  }
}

export function feedFor(model, create = true) {
  const uid = model.get("uid") || "";
  let feed = FEEDS.get(uid);
  if (!feed && create) {
    feed = new LiveFeed(model);
    if (uid) FEEDS.set(uid, feed);
  }
  return feed;
}

export function dropFeed(model) {
  const uid = model.get("uid") || "";
  const feed = FEEDS.get(uid);
  if (feed) {
    feed.destroy();
    FEEDS.delete(uid);
  }
}
