//! `xio-bench report`: the X-IO paper's experiments (Figs. 7 to 10), the
//! peers' rows and the one-core placement in one run, written to a folder
//! as a markdown summary and SVG plots.
//!
//! Each experiment is one of the other subcommands, run as a child process
//! of this binary with its markdown captured (`<step>.md`, its progress
//! lines in `<step>.log`); the plots are drawn from the tables in that
//! markdown, so the report shows exactly what the subcommands print.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;

/// Options of `xio-bench report`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReportArgs {
    /// Short form (every step `--quick`, fewer sizes and connection
    /// counts): a few minutes; what CI runs.
    #[arg(long)]
    pub quick: bool,
    /// Folder for the summary (`report.md`), the plots (`*.svg`) and each
    /// step's output; created if missing.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Run only these steps (default: all).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub steps: Vec<Step>,
}

/// One experiment of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    /// Fig. 7: zero-copy round trip against io_uring, the sockets and
    /// iceoryx2, by message size (`compare`).
    Fig7,
    /// Fig. 8: one persistent connection's round trip, and short
    /// connections split into connect, data and close (`sockets` a, b).
    Fig8,
    /// Fig. 9: HTTP/1.1 requests/s against connections (`http`).
    Fig9,
    /// Fig. 10: concurrent connections, batched wake-up on and off
    /// (`sockets` c).
    Fig10,
    /// xio-tokio beside X-IO's own event loop and shmipc (`tokio`).
    Peers,
    /// Client and server on one core (`compare` and `sockets` a).
    OneCore,
}

impl Step {
    const ALL: [Step; 6] = [
        Step::Fig7,
        Step::Fig8,
        Step::Fig9,
        Step::Fig10,
        Step::Peers,
        Step::OneCore,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Fig7 => "fig7",
            Step::Fig8 => "fig8",
            Step::Fig9 => "fig9",
            Step::Fig10 => "fig10",
            Step::Peers => "peers",
            Step::OneCore => "one-core",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Step::Fig7 => "Fig. 7: zero-copy round trip against io_uring, by message size",
            Step::Fig8 => "Fig. 8: one connection, persistent and short",
            Step::Fig9 => "Fig. 9: HTTP/1.1 requests per second against connections",
            Step::Fig10 => "Fig. 10: concurrent connections, batched wake-up on and off",
            Step::Peers => "Peers: xio-tokio, X-IO's event loop and shmipc under tokio",
            Step::OneCore => "One core: client and server on the same CPU",
        }
    }

    /// The subcommands (each a child process) of this step.
    fn commands(self, quick: bool) -> Vec<Vec<String>> {
        let q = |v: &[&str]| {
            let mut v: Vec<String> = v.iter().map(|s| (*s).to_owned()).collect();
            if quick {
                v.push("--quick".into());
            }
            v
        };
        let conns = if quick { "1,16,64" } else { "1,16,64,256" };
        match self {
            Step::Fig7 => vec![q(&[
                "compare",
                "--sections",
                "apart",
                "--modes",
                "busy-poll",
                "--sizes",
                if quick { "64,4K" } else { "64,1K,4K,16K,64K" },
                "--idle-ms",
                "0",
            ])],
            Step::Fig8 => vec![q(&[
                "sockets",
                "--sections",
                "a,b",
                "--sizes",
                "64",
                "--placement",
                "apart",
                "--transports",
                "uds,tcp,xio,xio-zc",
            ])],
            Step::Fig9 => vec![q(&["http", "--versions", "h1", "--conns", conns])],
            Step::Fig10 => vec![q(&[
                "sockets",
                "--sections",
                "c",
                "--conns",
                conns,
                "--placement",
                "apart",
                "--transports",
                "uds,tcp,xio,xio-no-batch",
            ])],
            Step::Peers => vec![q(&[
                "tokio",
                "--conns",
                conns,
                "--transports",
                "xio,xio-poll,shmipc,shmipc-eventfd",
            ])],
            Step::OneCore => vec![
                q(&[
                    "compare",
                    "--sections",
                    "one-core",
                    "--modes",
                    "adaptive,blocking",
                ]),
                q(&[
                    "sockets",
                    "--sections",
                    "a",
                    "--sizes",
                    "64",
                    "--placement",
                    "one-core",
                    "--transports",
                    "uds,tcp,xio",
                ]),
            ],
        }
    }
}

/// Runs `xio-bench report`.
pub fn run(a: &ReportArgs) -> Result<()> {
    let steps: Vec<Step> = if a.steps.is_empty() {
        Step::ALL.to_vec()
    } else {
        a.steps.clone()
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {:?}", a.out))?;
    let exe = std::env::current_exe().context("locating the xio-bench binary")?;
    let commands: Vec<(Step, usize, Vec<String>)> = steps
        .iter()
        .flat_map(|&s| {
            s.commands(a.quick)
                .into_iter()
                .enumerate()
                .map(move |(i, c)| (s, i, c))
        })
        .collect();
    let bar = Progress::new(commands.len());
    let started = Instant::now();
    let wall_start = std::time::SystemTime::now();
    let mut outputs: Vec<(Step, String, String)> = Vec::new();
    let mut failed = Vec::new();
    for (k, (step, i, args)) in commands.iter().enumerate() {
        let stem = if *i == 0 {
            step.name().to_owned()
        } else {
            format!("{}-{}", step.name(), i + 1)
        };
        let shown = format!("xio-bench {}", args.join(" "));
        bar.step(k, &shown);
        let md = a.out.join(format!("{stem}.md"));
        let log = a.out.join(format!("{stem}.log"));
        let out = std::fs::File::create(&md).with_context(|| format!("creating {md:?}"))?;
        let err = std::fs::File::create(&log).with_context(|| format!("creating {log:?}"))?;
        let status = Command::new(&exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .with_context(|| format!("running {shown}"))?;
        let text = std::fs::read_to_string(&md).unwrap_or_default();
        if !status.success() {
            failed.push(format!(
                "`{shown}` failed ({status}); see {}",
                log.display()
            ));
        }
        outputs.push((*step, shown, text));
    }
    bar.finish(started.elapsed());

    let mut summary = String::new();
    writeln!(summary, "# X-IO benchmark report\n")?;
    writeln!(
        summary,
        "Command: `{}`, started {} UTC, {:.0} s. Each step is an `xio-bench` subcommand \
         run as its own process; its output follows its plot. Every table prints the \
         host phase (the raw ring's rate) it ran in: compare figures only within one \
         run.\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        utc(wall_start),
        started.elapsed().as_secs_f64()
    )?;
    for f in &failed {
        writeln!(summary, "* {f}")?;
    }
    if !failed.is_empty() {
        writeln!(summary)?;
    }
    let mut plotted = Vec::new();
    for &step in &steps {
        writeln!(summary, "## {}\n", step.title())?;
        let texts: Vec<&str> = outputs
            .iter()
            .filter(|o| o.0 == step)
            .map(|o| o.2.as_str())
            .collect();
        let svg = a.out.join(format!("{}.svg", step.name()));
        match plot(step, &texts, &svg) {
            Ok(()) => {
                writeln!(summary, "![{}]({}.svg)\n", step.title(), step.name())?;
                plotted.push(svg);
            }
            Err(e) => {
                writeln!(summary, "(no plot: {e:#})\n")?;
                failed.push(format!("the {} plot: {e:#}", step.name()));
            }
        }
        for (_, shown, text) in outputs.iter().filter(|o| o.0 == step) {
            writeln!(summary, "`{shown}`:\n")?;
            summary.push_str(&demote_headings(text));
            summary.push('\n');
        }
    }
    let path = a.out.join("report.md");
    std::fs::write(&path, summary).with_context(|| format!("writing {path:?}"))?;
    println!("{}", path.display());
    for p in &plotted {
        println!("{}", p.display());
    }
    if !failed.is_empty() {
        bail!("{} failure(s): {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

/// The report's progress: a bar on a terminal, a line per step otherwise
/// (a CI log).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
}

impl Progress {
    fn new(total: usize) -> Self {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}",
                )
                .expect("a valid template"),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Self { bar, total }
    }

    fn step(&self, k: usize, what: &str) {
        match &self.bar {
            Some(b) => {
                b.set_position(k as u64);
                b.set_message(what.to_owned());
            }
            None => eprintln!("[xio-bench report] {}/{}: {what}", k + 1, self.total),
        }
    }

    fn finish(&self, took: Duration) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        eprintln!(
            "[xio-bench report] {} step(s) in {:.0} s",
            self.total,
            took.as_secs_f64()
        );
    }
}

/// `t` as `YYYY-MM-DD hh:mm` in UTC.
fn utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// A subcommand's markdown with its headings one level down, under the
/// report's own.
fn demote_headings(md: &str) -> String {
    let mut out = String::with_capacity(md.len() + 64);
    for line in md.lines() {
        if line.starts_with('#') {
            out.push('#');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------
// Reading the tables back
// ---------------------------------------------------------------------------

/// A markdown table and the heading above it.
#[derive(Debug)]
struct Table {
    heading: String,
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn col(&self, name: &str) -> Option<usize> {
        self.head.iter().position(|h| h == name)
    }
}

/// Every table in `md`.
fn tables(md: &str) -> Vec<Table> {
    let cells = |l: &str| -> Vec<String> {
        l.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut lines = md.lines().peekable();
    while let Some(l) = lines.next() {
        if let Some(h) = l.strip_prefix('#') {
            heading = h.trim_start_matches('#').trim().to_owned();
            continue;
        }
        let rule = lines
            .peek()
            .is_some_and(|n| n.starts_with("|-") || n.starts_with("|:"));
        if !l.starts_with('|') || !rule {
            continue;
        }
        lines.next();
        let mut t = Table {
            heading: heading.clone(),
            head: cells(l),
            rows: Vec::new(),
        };
        while let Some(r) = lines.next_if(|r| r.starts_with('|')) {
            t.rows.push(cells(r));
        }
        out.push(t);
    }
    out
}

/// The number a cell starts with (`"1.35x"`, `"64"`, `"0.57 (n=20)"`).
fn num(cell: &str) -> Option<f64> {
    let s: String = cell
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-' || *c == 'e')
        .collect();
    s.parse().ok()
}

/// Microseconds of a time cell as the tables print them (`"0.57"` in µs,
/// `"8.0 ms"`, `"1.2 s"`).
fn micros(cell: &str) -> Option<f64> {
    let n = num(cell)?;
    let c = cell.trim();
    Some(if c.ends_with(" ms") {
        n * 1e3
    } else if c.ends_with(" s") {
        n * 1e6
    } else {
        n
    })
}

/// Bytes of a size cell (`"64 B"`, `"4 KiB"`, `"1 MiB"`).
fn bytes(cell: &str) -> Option<f64> {
    let n = num(cell)?;
    let unit = cell
        .trim()
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    Some(match unit.trim() {
        "KiB" | "K" => n * 1024.0,
        "MiB" | "M" => n * 1024.0 * 1024.0,
        _ => n,
    })
}

/// A named line of points.
type Series = (String, Vec<(f64, f64)>);

/// From a wide table (`| conns | A req/s | A p50 | B req/s | ...`): one
/// series per transport of the columns ending in ` {metric}`, against the
/// first column.
fn wide_series(t: &Table, metric: &str, x: fn(&str) -> Option<f64>) -> Vec<Series> {
    let suffix = format!(" {metric}");
    t.head
        .iter()
        .enumerate()
        .filter_map(|(i, h)| Some((i, h.strip_suffix(&suffix)?.to_owned())))
        .map(|(i, name)| {
            let pts = t
                .rows
                .iter()
                .filter_map(|r| Some((x(r.first()?)?, num(r.get(i)?)?)))
                .collect();
            (name, pts)
        })
        .filter(|(_, p): &Series| !p.is_empty())
        .collect()
}

/// From a long table (`| size | transport | p50 | ...`): one series per
/// transport.
fn long_series(t: &Table, x_col: usize, name_col: usize, y_col: usize) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in &t.rows {
        let (Some(x), Some(name), Some(y)) = (
            r.get(x_col).and_then(|c| bytes(c)),
            r.get(name_col),
            r.get(y_col).and_then(|c| micros(c)),
        ) else {
            continue;
        };
        // A row with a note ("(20 iters only)": busy-polling on one core)
        // is a handful of samples the table explains; not plotted.
        if name.contains(" (") && !name.ends_with("(floor)") {
            continue;
        }
        match out.iter_mut().find(|s| &s.0 == name) {
            Some(s) => s.1.push((x, y)),
            None => out.push((name.clone(), vec![(x, y)])),
        }
    }
    out
}

fn find<'a>(ts: &'a [Table], heading: &str, first_col: &str) -> Result<&'a Table> {
    ts.iter()
        .find(|t| t.heading.contains(heading) && t.head.first().is_some_and(|h| h == first_col))
        .ok_or_else(|| anyhow!("no table under a heading with {heading:?}"))
}

// ---------------------------------------------------------------------------
// Plots
// ---------------------------------------------------------------------------

/// Draws `step`'s plot from its subcommands' markdown.
fn plot(step: Step, texts: &[&str], svg: &Path) -> Result<()> {
    let ts: Vec<Table> = texts.iter().flat_map(|t| tables(t)).collect();
    match step {
        Step::Fig7 => round_trips(step, find(&ts, "Round trip, separate cores", "size")?, svg),
        Step::Fig8 => {
            let a = find(&ts, "(a) Round trip", "size")?;
            let persistent: Vec<(String, f64)> = wide_series(a, "p50", bytes)
                .into_iter()
                .filter_map(|(n, p)| Some((n, p.first()?.1)))
                .collect();
            let b = find(&ts, "(b) Short connections", "")?;
            let names: Vec<String> = b.head[1..].to_vec();
            let phase = |row: &str| -> Vec<f64> {
                let r = b.rows.iter().find(|r| r.first().is_some_and(|c| c == row));
                (0..names.len())
                    .map(|i| {
                        r.and_then(|r| r.get(i + 1))
                            .and_then(|c| num(c))
                            .unwrap_or(0.0)
                    })
                    .collect()
            };
            let stacks = [
                ("connect", phase("connect p50 (µs)")),
                ("data", phase("data p50 (µs)")),
                ("close", phase("close p50 (µs)")),
            ];
            bars(svg, step.title(), &persistent, &names, &stacks)
        }
        Step::Fig9 => {
            let t = find(&ts, "HTTP/1.1", "conns")?;
            let series = wide_series(t, "req/s", num);
            let legend = SeriesLabelPosition::LowerRight;
            lines(
                svg,
                step.title(),
                "connections",
                "requests/s",
                &series,
                legend,
            )
        }
        Step::Fig10 => {
            let t = find(&ts, "(c) Concurrent connections", "conns")?;
            let series = wide_series(t, "p50", num);
            let legend = SeriesLabelPosition::UpperLeft;
            lines(
                svg,
                step.title(),
                "connections",
                "request p50 (µs)",
                &series,
                legend,
            )
        }
        Step::Peers => {
            let t = ts
                .iter()
                .find(|t| t.head.first().is_some_and(|h| h == "conns") && t.head.len() > 3)
                .ok_or_else(|| anyhow!("no requests/s table"))?;
            let series = wide_series(t, "req/s", num);
            let legend = SeriesLabelPosition::LowerRight;
            lines(svg, step.title(), "streams", "requests/s", &series, legend)
        }
        Step::OneCore => round_trips(step, find(&ts, "one core", "size")?, svg),
    }
}

/// A `compare` round-trip table (`| size | transport | p50 | ...`) as
/// lines of p50 against message size, one per transport.
fn round_trips(step: Step, t: &Table, svg: &Path) -> Result<()> {
    let col = |name| t.col(name).ok_or_else(|| anyhow!("no {name} column"));
    let series = long_series(t, 0, col("transport")?, col("p50")?);
    lines(
        svg,
        step.title(),
        "message size (bytes)",
        "round trip p50 (µs)",
        &series,
        SeriesLabelPosition::MiddleRight,
    )
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e}")
}

/// An axis label: `2.5M`, `640k`, `64`, `0.57`.
fn fmt_axis(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// `v` with at most two decimals and none that are zero.
fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Lines of points on log-log axes; the legend at `legend`, where the
/// lines are not.
fn lines(
    svg: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    legend: SeriesLabelPosition,
) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        if x > 0.0 && y > 0.0 {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
    }
    if x0 > x1 {
        bail!("no points");
    }
    let root = SVGBackend::new(svg, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 / 1.3..x1 * 1.3).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| fmt_axis(*x))
        .y_label_formatter(&|y| fmt_axis(*y))
        .draw()
        .map_err(plot_err)?;
    for (i, (name, p)) in series.iter().enumerate() {
        let c = color(i);
        let p: Vec<(f64, f64)> = p
            .iter()
            .copied()
            .filter(|&(x, y)| x > 0.0 && y > 0.0)
            .collect();
        chart
            .draw_series(LineSeries::new(p.clone(), c.stroke_width(2)))
            .map_err(plot_err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(p.into_iter().map(|xy| Circle::new(xy, 3, c.filled())))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Fig. 8: per transport, the persistent connection's round trip (left
/// panel) and a short connection's phases stacked (right panel), µs.
fn bars(
    svg: &Path,
    title: &str,
    persistent: &[(String, f64)],
    names: &[String],
    stacks: &[(&str, Vec<f64>); 3],
) -> Result<()> {
    if persistent.is_empty() && names.is_empty() {
        bail!("no bars");
    }
    let root = SVGBackend::new(svg, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(plot_err)?;
    let (left, right) = root.split_horizontally(440);
    let label_of = |list: Vec<String>| {
        move |x: &f64| -> String {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                list.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        }
    };
    {
        let top = persistent.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15;
        let n = persistent.len();
        let names: Vec<String> = persistent.iter().map(|p| p.0.clone()).collect();
        let mut chart = ChartBuilder::on(&left)
            .caption("persistent: round trip p50 (µs)", ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(-0.6..(n as f64 - 0.4), 0.0..top.max(1e-3))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n.max(1) * 2 + 1)
            .x_label_formatter(&label_of(names))
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(persistent.iter().enumerate().map(|(i, (_, v))| {
                let x = i as f64;
                Rectangle::new([(x - 0.35, 0.0), (x + 0.35, *v)], color(0).filled())
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(persistent.iter().enumerate().map(|(i, (_, v))| {
                Text::new(
                    format!("{v:.2}"),
                    (i as f64 - 0.3, *v * 1.02 + top * 0.02),
                    ("sans-serif", 12),
                )
            }))
            .map_err(plot_err)?;
    }
    {
        let n = names.len();
        let totals: Vec<f64> = (0..n)
            .map(|i| stacks.iter().map(|s| s.1[i]).sum())
            .collect();
        let top = totals.iter().copied().fold(0.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(&right)
            .caption(
                "short connection: connect + data + close p50 (µs)",
                ("sans-serif", 15),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(-0.6..(n as f64 - 0.4), 0.0..top.max(1e-3))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n.max(1) * 2 + 1)
            .x_label_formatter(&label_of(names.to_vec()))
            .draw()
            .map_err(plot_err)?;
        let mut base = vec![0.0; n];
        for (k, (phase, v)) in stacks.iter().enumerate() {
            let c = color(k + 1);
            let from = base.clone();
            for (b, x) in base.iter_mut().zip(v) {
                *b += x;
            }
            let to = base.clone();
            chart
                .draw_series((0..n).map(|i| {
                    let x = i as f64;
                    Rectangle::new([(x - 0.35, from[i]), (x + 0.35, to[i])], c.filled())
                }))
                .map_err(plot_err)?
                .label(*phase)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        chart
            .draw_series(totals.iter().enumerate().map(|(i, v)| {
                Text::new(
                    format!("{v:.2}"),
                    (i as f64 - 0.3, *v + top * 0.02),
                    ("sans-serif", 12),
                )
            }))
            .map_err(plot_err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKETS: &str = "\
## Stream sockets\n\
\n\
### (c) Concurrent connections, 64 B request-response, separate cores\n\
\n\
| conns | UDS req/s | UDS p50 | UDS p99 | X-IO req/s | X-IO p50 | X-IO p99 |\n\
|---:|---:|---:|---:|---:|---:|---:|\n\
| 1 | 9000 | 110.5 | 200.1 | 900000 | 1.05 | 2.10 |\n\
| 16 | 90000 | 170.0 | 300.0 | failed | | |\n\
\n";

    #[test]
    fn tables_are_read_back_by_heading_and_column() {
        let ts = tables(SOCKETS);
        assert_eq!(ts.len(), 1);
        let t = find(&ts, "(c) Concurrent", "conns").unwrap();
        assert_eq!(t.rows.len(), 2);
        let s = wide_series(t, "p50", num);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], ("UDS".to_owned(), vec![(1.0, 110.5), (16.0, 170.0)]));
        // A failed cell is no point, not a zero.
        assert_eq!(s[1], ("X-IO".to_owned(), vec![(1.0, 1.05)]));
        assert!(find(&ts, "(a) Round trip", "size").is_err());
    }

    #[test]
    fn sizes_and_numbers_parse_as_printed() {
        assert_eq!(bytes("64 B"), Some(64.0));
        assert_eq!(bytes("4 KiB"), Some(4096.0));
        assert_eq!(bytes("1 MiB"), Some(1048576.0));
        assert_eq!(num("1.35x"), Some(1.35));
        assert_eq!(num("failed"), None);
        assert_eq!(fmt_axis(2_500_000.0), "2.5M");
        assert_eq!(fmt_axis(64_000.0), "64k");
        assert_eq!(fmt_axis(64.0), "64");
        assert_eq!(fmt_axis(0.57), "0.57");
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_796_570_000);
        assert_eq!(utc(t), "2026-12-06 15:13");
        assert_eq!(utc(std::time::UNIX_EPOCH), "1970-01-01 00:00");
        let long = "### Round trip, separate cores (client CPU 0, server CPU 1)\n\n\
| size | transport | p50 | p99 |\n|---|---|---:|---:|\n\
| 64 B | X-IO BusyPoll | 0.57 | 1.1 |\n| 4 KiB | X-IO BusyPoll | 0.53 | 1.8 |\n\
| 64 B | SpinRing (20 iters only) | 0.2 | 0.3 |\n";
        let ts = tables(long);
        let s = long_series(&ts[0], 0, 1, 2);
        assert_eq!(
            s[0],
            (
                "X-IO BusyPoll".to_owned(),
                vec![(64.0, 0.57), (4096.0, 0.53)]
            )
        );
        assert_eq!(s.len(), 1, "the noted row is not plotted");
        assert_eq!(micros("8.0 ms"), Some(8000.0));
    }

    /// The plots come out as SVG files with every series named.
    #[test]
    fn a_line_plot_and_the_bars_are_written() {
        let dir = std::env::temp_dir().join(format!("xio-report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ts = tables(SOCKETS);
        let s = wide_series(&ts[0], "req/s", num);
        let svg = dir.join("c.svg");
        lines(&svg, "title", "x", "y", &s, SeriesLabelPosition::UpperLeft).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("UDS") && text.contains("X-IO"));
        let svg = dir.join("b.svg");
        let names = vec!["UDS".to_owned(), "X-IO".to_owned()];
        let stacks = [
            ("connect", vec![17.0, 0.3]),
            ("data", vec![58.0, 1.7]),
            ("close", vec![4.9, 0.4]),
        ];
        bars(
            &svg,
            "t",
            &[("UDS".into(), 53.0), ("X-IO".into(), 1.0)],
            &names,
            &stacks,
        )
        .unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("connect") && text.contains("close"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
