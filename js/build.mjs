// Builds the widget bundle: one ES module (anywidget entry + renderStatic) with plotly's
// basic bundle inlined, so notebooks and HTML reports render with no network.
import * as esbuild from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outfile = path.resolve(here, "..", "onnx_sbs_nb", "static", "widget.js");
const options = {
  entryPoints: [path.join(here, "src", "index.js")],
  bundle: true,
  format: "esm",
  outfile,
  minify: !process.env.SBS_NO_MINIFY, // SBS_NO_MINIFY=1 node build.mjs: readable profiles
  target: ["es2020"],
  loader: { ".css": "text" },
  legalComments: "eof",
  logLevel: "info",
};

if (process.argv.includes("--watch")) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else {
  await esbuild.build(options);
}
