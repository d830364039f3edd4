// Thin wrapper around the vendored uPlot (window.uPlot, loaded as a classic script in index.html).
// Charts share one style (colours read from the theme's CSS variables) and resize with their container.

const COLORS = ["#4fc3f7", "#ffb74d", "#81c784", "#e57373", "#ba68c8", "#fff176"];

function css(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

/**
 * lineChart(container, {title, series: [{label, unit, scale, stepped, minutes}], data: [xs, ys1, ...]})
 * Returns {update(data), destroy()}. x values are unix seconds.
 */
export function lineChart(container, { title, series, data, yRange }) {
  const U = window.uPlot;
  if (!U) {
    container.textContent = "charts unavailable (uPlot failed to load)";
    return { update() {}, destroy() {} };
  }
  const axisStroke = css("--muted", "#9aa4b2");
  const grid = { stroke: css("--grid", "rgba(255,255,255,0.08)"), width: 1 };
  const scales = { x: { time: true } };
  const axes = [{ stroke: axisStroke, grid, ticks: grid }];
  const seen = new Set();
  series.forEach((s) => {
    const sc = s.scale || "y";
    if (seen.has(sc)) return;
    seen.add(sc);
    scales[sc] = sc === "y" && yRange ? { range: yRange } : (s.range ? { range: s.range } : {});
    axes.push({
      scale: sc,
      stroke: axisStroke,
      grid: sc === "y" ? grid : { show: false },
      ticks: grid,
      side: sc === "y" ? 3 : 1,
      size: 50,
      // A 0/1 series (throttled) wants exactly two labelled ticks.
      ...(s.ticks ? { splits: () => s.ticks, values: (u, vals) => vals.map((v) => s.tickLabels[s.ticks.indexOf(v)] ?? "") } : {}),
    });
  });
  const opts = {
    title,
    width: Math.max(200, container.clientWidth || 600),
    height: 200,
    scales,
    axes,
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
    series: [
      { value: "{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}" },
      ...series.map((s, i) => ({
        label: s.label,
        scale: s.scale || "y",
        stroke: s.color || COLORS[i % COLORS.length],
        width: 1.5,
        // a roll-up is two points a minute with a null between minutes apart: a gap, not a line across it
        spanGaps: !s.minutes,
        paths: s.stepped ? U.paths.stepped({ align: 1 }) : undefined,
        value: (u, v) => (v === null || v === undefined ? "—"
          : s.tickLabels ? (s.tickLabels[s.ticks.indexOf(v)] ?? String(v)) : `${+v.toFixed(s.digits ?? 1)}${s.unit || ""}`),
      })),
    ],
  };
  const plot = new U(opts, data, container);
  // Follow the container width (phone rotation, window resize).
  const ro = new ResizeObserver(() => {
    const w = container.clientWidth;
    if (w && Math.abs(w - plot.width) > 2) plot.setSize({ width: w, height: 200 });
  });
  ro.observe(container);
  return {
    update(d) { plot.setData(d); },
    destroy() { ro.disconnect(); plot.destroy(); },
  };
}

/** Merge data tables with different x values (e.g. telemetry + per-minute roll-ups). */
export function join(tables) {
  const U = window.uPlot;
  if (tables.length === 1) return tables[0];
  return U ? U.join(tables) : tables[0];
}
