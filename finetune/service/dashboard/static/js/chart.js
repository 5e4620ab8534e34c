// Charts on uPlot (vendored, see vendor/uplot/LICENSE). The server already down-samples long runs, so a
// 10,000-step run arrives as at most ~1,600 points per series.

const uPlot = window.uPlot;
export const COLORS = ["#1f5fbf", "#d9480f", "#2b8a3e", "#7048e8", "#c2255c", "#0b7285", "#5c940d", "#e67700"];

export function ema(values, alpha) {
  if (!alpha) return values.slice();
  const out = [];
  let last = 0, weight = 0;
  for (const v of values) {
    if (v === null || v === undefined || !Number.isFinite(v)) { out.push(null); continue; }
    last = alpha * last + (1 - alpha) * v;
    weight = alpha * weight + (1 - alpha);
    out.push(last / weight); // debiased, so the start is not pulled to zero
  }
  return out;
}

// Align several (x, y) series on one x axis (nulls where a series has no point).
export function align(seriesList) {
  const xs = [...new Set(seriesList.flatMap((s) => s.x.filter((v) => v !== null && v !== undefined)))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = seriesList.map((s) => {
    const col = new Array(xs.length).fill(null);
    s.x.forEach((x, i) => { if (index.has(x)) col[index.get(x)] = s.y[i]; });
    return col;
  });
  return [xs, ...ys];
}

function tick(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a < 1e-2 || a >= 1e5 ? v.toExponential(1) : String(+v.toPrecision(3));
}

function widthOf(el) {
  return Math.max(260, Math.floor(el.clientWidth || el.parentElement?.clientWidth || 600));
}

// Vertical marks (checkpoints dashed grey, best solid green) drawn under the series.
function marksPlugin(getMarks) {
  return {
    hooks: {
      draw: [(u) => {
        const { ctx } = u;
        const { top, height } = u.bbox;
        for (const m of getMarks()) {
          const x = u.valToPos(m.x, "x", true);
          if (!Number.isFinite(x) || x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.save();
          ctx.strokeStyle = m.color;
          ctx.lineWidth = m.width * devicePixelRatio;
          ctx.setLineDash(m.dash.map((d) => d * devicePixelRatio));
          ctx.beginPath();
          ctx.moveTo(x, top);
          ctx.lineTo(x, top + height);
          ctx.stroke();
          ctx.restore();
        }
      }],
    },
  };
}

export function makeChart(el, { title, xLabel, yLabel, series, data, height = 260, marks = () => [], sync, log = false }) {
  const opts = {
    title,
    width: widthOf(el),
    height,
    cursor: { sync: sync ? { key: sync } : undefined, drag: { x: true, y: false } },
    scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
    axes: [{ label: xLabel }, { label: yLabel, size: 70, values: (_u, ticks) => ticks.map(tick) }],
    legend: { live: true },
    series: [{ label: xLabel }, ...series],
    plugins: [marksPlugin(marks)],
  };
  const plot = new uPlot(opts, data, el);
  const ro = new ResizeObserver(() => plot.setSize({ width: widthOf(el), height }));
  ro.observe(el);
  plot.disconnect = () => ro.disconnect();
  el.setAttribute("role", "img");
  return plot;
}

export function line(label, color, { width = 2, faint = false, points = false, dash } = {}) {
  return {
    label,
    stroke: faint ? `${color}55` : color,
    width: faint ? 1 : width,
    spanGaps: true,
    dash,
    points: { show: points, size: 6, fill: color },
    value: (_u, v) => (v === null || v === undefined ? "–" : Number(v).toPrecision(4)),
  };
}
