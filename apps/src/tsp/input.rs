//! Where instances come from: a deterministic random generator, the classic matrix file
//! (first line N, then N lines of N integer weights, asymmetric allowed) and TSPLIB
//! `.tsp`/`.atsp` files (EUC_2D, CEIL_2D, GEO, ATT, and EXPLICIT in every
//! EDGE_WEIGHT_FORMAT of the TSPLIB 95 description). Every malformed input becomes a
//! [`ParseError`] naming the 1-based line at fault; nothing here panics on bad input.
//!
//! TSPLIB notes. `EOF` is optional, as the TSPLIB 95 description says; a file that ends
//! before a section has all its data is an error naming the last line. Weight lists may
//! be laid out over lines in any way (files like gr17 pack several rows per line); when a
//! section has the wrong number of weights and its lines look like one matrix row each,
//! the error names the first row line of the wrong length.

use super::{Instance, MAX_CITIES, MAX_WEIGHT};
use std::fmt;
use std::path::Path;

/// A malformed input: the line (1-based) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for ParseError {}

fn err<T>(line: usize, msg: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError {
        line,
        msg: msg.into(),
    })
}

/// Which file format to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// First line N, then N rows of N weights.
    Matrix,
    Tsplib,
    /// Matrix if the first non-blank line is a lone integer, TSPLIB otherwise.
    Auto,
}

pub use crate::SplitMix64;

/// Largest weight of a random instance (weights are uniform in `1..=RANDOM_MAX_WEIGHT`).
pub const RANDOM_MAX_WEIGHT: i64 = 1000;

/// A random instance: uniform integer weights in `1..=1000`, the same both ways unless
/// `asymmetric`. `n` must be in `1..=MAX_CITIES`.
pub fn random(n: usize, seed: u64, asymmetric: bool) -> Instance {
    assert!((1..=MAX_CITIES).contains(&n), "1..={MAX_CITIES} cities");
    let mut rng = SplitMix64::new(seed);
    let mut dist = vec![0i64; n * n];
    for i in 0..n {
        for j in 0..n {
            if i == j || (!asymmetric && j < i) {
                continue;
            }
            let w = 1 + rng.below(RANDOM_MAX_WEIGHT as u64) as i64;
            dist[i * n + j] = w;
            if !asymmetric {
                dist[j * n + i] = w;
            }
        }
    }
    let kind = if asymmetric {
        "asymmetric"
    } else {
        "symmetric"
    };
    Instance::new(format!("random {kind}, seed {seed}"), n, dist)
}

/// Largest instance file read: a full distance matrix of the largest instance the branch
/// and bound can hope to solve (a few dozen cities) is a few KB; this leaves room for
/// comments and coordinates with many digits while refusing to swallow `/dev/zero`.
pub const MAX_INPUT_BYTES: u64 = 4 << 20;

/// Reads an instance from a file: a regular file of at most [`MAX_INPUT_BYTES`].
pub fn load(path: &Path, format: Format) -> Result<Instance, String> {
    use std::io::Read;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "{}: not a regular file (instances are read from files)",
            path.display()
        ));
    }
    let too_large = || {
        format!(
            "{}: larger than {} MiB; TSP instances are a few KB",
            path.display(),
            MAX_INPUT_BYTES >> 20
        )
    };
    if meta.len() > MAX_INPUT_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // The file may have grown since it was measured.
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(too_large());
    }
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        format!("{}: line {line}: not UTF-8 text", path.display())
    })?;
    let mut inst = parse(text, format).map_err(|e| format!("{}: {e}", path.display()))?;
    if inst.name.is_empty() {
        inst.name = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    Ok(inst)
}

/// Parses an instance in `format`.
pub fn parse(text: &str, format: Format) -> Result<Instance, ParseError> {
    match format {
        Format::Matrix => parse_matrix(text),
        Format::Tsplib => parse_tsplib(text),
        Format::Auto => match detect(text) {
            Format::Matrix => parse_matrix(text),
            _ => parse_tsplib(text),
        },
    }
}

/// The format `text` looks like: a matrix file starts with a lone integer.
pub fn detect(text: &str) -> Format {
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    match first {
        Some(l) if l.split_whitespace().count() == 1 && l.parse::<u64>().is_ok() => Format::Matrix,
        _ => Format::Tsplib,
    }
}

/// Non-blank lines with their 1-based numbers, trimmed.
fn numbered(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
}

/// Number of the file's last line (for errors about a file that ends too early).
fn last_line(text: &str) -> usize {
    text.lines().count().max(1)
}

fn city_count(line: usize, what: &str, tok: &str) -> Result<usize, ParseError> {
    let n: usize = match tok.parse() {
        Ok(n) => n,
        Err(_) => return err(line, format!("{what} '{tok}' is not a positive integer")),
    };
    if n == 0 {
        return err(
            line,
            format!("{what} is 0: an instance needs at least one city"),
        );
    }
    if n > MAX_CITIES {
        return err(
            line,
            format!("{what} {n} is more than the {MAX_CITIES} cities this solver handles"),
        );
    }
    Ok(n)
}

fn weight(line: usize, tok: &str) -> Result<i64, ParseError> {
    match tok.parse::<i64>() {
        Ok(w) if w.abs() <= MAX_WEIGHT => Ok(w),
        Ok(w) => err(
            line,
            format!("weight {w} is out of range (at most 2^40 in magnitude)"),
        ),
        Err(_) => err(line, format!("weight '{tok}' is not an integer")),
    }
}

/// The classic format: the city count alone on the first line, then one line of N
/// integer weights per matrix row (blank lines are ignored; the diagonal is not used).
pub fn parse_matrix(text: &str) -> Result<Instance, ParseError> {
    let mut lines = numbered(text);
    let Some((ln, first)) = lines.next() else {
        return err(1, "empty file: expected the number of cities");
    };
    let fields: Vec<&str> = first.split_whitespace().collect();
    if fields.len() != 1 {
        return err(
            ln,
            format!(
                "expected the number of cities alone on the line, found {} fields",
                fields.len()
            ),
        );
    }
    let n = city_count(ln, "number of cities", fields[0])?;
    let mut dist = vec![0i64; n * n];
    let mut at = ln;
    for row in 0..n {
        let Some((ln, l)) = lines.next() else {
            return err(
                last_line(text).max(at),
                format!("file ends after {row} of the {n} matrix rows"),
            );
        };
        at = ln;
        let toks: Vec<&str> = l.split_whitespace().collect();
        if toks.len() != n {
            return err(ln, format!("expected {n} weights, found {}", toks.len()));
        }
        for (col, tok) in toks.into_iter().enumerate() {
            if col != row {
                dist[row * n + col] = weight(ln, tok)?;
            } else if tok.parse::<i64>().is_err() {
                // Files put anything on the unused diagonal (0, -1, a large
                // "infinity"), but it must still be a number.
                return err(ln, format!("weight '{tok}' is not an integer"));
            }
        }
    }
    if let Some((ln, _)) = lines.next() {
        return err(
            ln,
            format!("unexpected content after the {n} rows of the matrix"),
        );
    }
    Ok(Instance::new("", n, dist))
}

/// TSPLIB EDGE_WEIGHT_TYPE values this reader computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WeightType {
    Explicit,
    Euc2d,
    Ceil2d,
    Geo,
    Att,
}

/// TSPLIB EDGE_WEIGHT_FORMAT values. Column-wise triangles of a symmetric matrix list
/// the same numbers as the opposite row-wise triangles, so they share the fill order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WeightFormat {
    Function,
    FullMatrix,
    UpperRow,
    LowerRow,
    UpperDiagRow,
    LowerDiagRow,
    UpperCol,
    LowerCol,
    UpperDiagCol,
    LowerDiagCol,
}

impl WeightFormat {
    fn parse(s: &str) -> Option<WeightFormat> {
        use WeightFormat::*;
        Some(match s {
            "FUNCTION" => Function,
            "FULL_MATRIX" => FullMatrix,
            "UPPER_ROW" => UpperRow,
            "LOWER_ROW" => LowerRow,
            "UPPER_DIAG_ROW" => UpperDiagRow,
            "LOWER_DIAG_ROW" => LowerDiagRow,
            "UPPER_COL" => UpperCol,
            "LOWER_COL" => LowerCol,
            "UPPER_DIAG_COL" => UpperDiagCol,
            "LOWER_DIAG_COL" => LowerDiagCol,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        use WeightFormat::*;
        match self {
            Function => "FUNCTION",
            FullMatrix => "FULL_MATRIX",
            UpperRow => "UPPER_ROW",
            LowerRow => "LOWER_ROW",
            UpperDiagRow => "UPPER_DIAG_ROW",
            LowerDiagRow => "LOWER_DIAG_ROW",
            UpperCol => "UPPER_COL",
            LowerCol => "LOWER_COL",
            UpperDiagCol => "UPPER_DIAG_COL",
            LowerDiagCol => "LOWER_DIAG_COL",
        }
    }

    /// The matrix cells, in the order the format lists them, for `n` cities (for
    /// triangles, the cell of the row-wise reading; the mirror gets the same weight).
    fn cells(self, n: usize) -> Vec<(usize, usize)> {
        use WeightFormat::*;
        let mut v = Vec::new();
        for i in 0..n {
            let cols = match self {
                Function => 0..0,
                FullMatrix => 0..n,
                UpperRow | LowerCol => i + 1..n,
                LowerRow | UpperCol => 0..i,
                UpperDiagRow | LowerDiagCol => i..n,
                LowerDiagRow | UpperDiagCol => 0..i + 1,
            };
            v.extend(cols.map(|j| (i, j)));
        }
        v
    }

    /// Lengths of the non-empty rows of the listing, for diagnosing one-row-per-line files.
    fn row_lengths(self, n: usize) -> Vec<usize> {
        let mut lens = vec![0usize; n];
        for (i, _) in self.cells(n) {
            lens[i] += 1;
        }
        lens.retain(|&l| l > 0);
        lens
    }
}

/// A data line of a section: its first field is a number (keywords start with a letter).
fn is_data(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|t| {
        t.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.')
    })
}

/// Splits `KEY : VALUE`, `KEY: VALUE` and a bare `KEY` (or `KEY VALUE`).
fn keyword(line: &str) -> (String, &str) {
    let (key, value) = match line.find(':') {
        Some(p) => (&line[..p], &line[p + 1..]),
        None => match line.find(char::is_whitespace) {
            Some(p) => (&line[..p], &line[p..]),
            None => (line, ""),
        },
    };
    (key.trim().to_ascii_uppercase(), value.trim())
}

struct Coords {
    line: usize,
    xy: Vec<(f64, f64)>,
}

/// Reads a TSPLIB file (symmetric TSP or ATSP).
pub fn parse_tsplib(text: &str) -> Result<Instance, ParseError> {
    let lines: Vec<(usize, &str)> = numbered(text).collect();
    let mut file = Tsplib {
        lines: &lines,
        next: 0,
        end: last_line(text),
        name: String::new(),
        dim: None,
        wtype: None,
        wformat: None,
        coords: None,
        weights: None,
    };
    while file.next < lines.len() {
        let (ln, line) = lines[file.next];
        file.next += 1;
        if is_data(line) {
            return err(ln, format!("expected a keyword, found '{line}'"));
        }
        let (key, value) = keyword(line);
        if key == "EOF" {
            break;
        }
        file.read_keyword(ln, &key, value)?;
    }
    file.into_instance()
}

/// A TSPLIB file being read: its lines, where reading is, and what the keywords and
/// sections read so far gave, each with the line it was on.
struct Tsplib<'a> {
    lines: &'a [(usize, &'a str)],
    /// Index in `lines` of the next line to read.
    next: usize,
    /// The file's last line, named when it ends too early.
    end: usize,
    name: String,
    dim: Option<(usize, usize)>,
    wtype: Option<(WeightType, usize)>,
    wformat: Option<(WeightFormat, usize)>,
    coords: Option<Coords>,
    weights: Option<(Vec<i64>, usize)>,
}

impl<'a> Tsplib<'a> {
    /// One keyword line (other than `EOF`), with the section it opens.
    fn read_keyword(&mut self, ln: usize, key: &str, value: &str) -> Result<(), ParseError> {
        match key {
            "NAME" => self.name = value.to_string(),
            "COMMENT" | "NODE_COORD_TYPE" | "DISPLAY_DATA_TYPE" => {}
            "TYPE" => {
                let t = value.split_whitespace().next().unwrap_or("");
                if t != "TSP" && t != "ATSP" {
                    return err(
                        ln,
                        format!("TYPE '{value}' is not supported (only TSP and ATSP)"),
                    );
                }
            }
            "DIMENSION" => {
                if let Some((_, first)) = self.dim {
                    return err(ln, format!("DIMENSION given twice (first on line {first})"));
                }
                self.dim = Some((city_count(ln, "DIMENSION", value)?, ln));
            }
            "EDGE_WEIGHT_TYPE" => self.wtype = Some((weight_type(ln, value)?, ln)),
            "EDGE_WEIGHT_FORMAT" => {
                let Some(f) = WeightFormat::parse(value) else {
                    return err(
                        ln,
                        format!(
                            "unknown EDGE_WEIGHT_FORMAT '{value}' (supported: FUNCTION, FULL_MATRIX, UPPER_ROW, LOWER_ROW, UPPER_DIAG_ROW, LOWER_DIAG_ROW and their _COL forms)"
                        ),
                    );
                };
                self.wformat = Some((f, ln));
            }
            "NODE_COORD_SECTION" => self.node_coord_section(ln)?,
            "EDGE_WEIGHT_SECTION" => self.edge_weight_section(ln)?,
            "DISPLAY_DATA_SECTION" => {
                // Display coordinates are for drawing only, never for distances.
                self.block();
            }
            "EDGE_DATA_FORMAT"
            | "EDGE_DATA_SECTION"
            | "FIXED_EDGES_SECTION"
            | "TOUR_SECTION"
            | "DEPOT_SECTION"
            | "DEMAND_SECTION"
            | "CAPACITY" => {
                return err(ln, format!("{key} is not supported by this solver"));
            }
            _ => return err(ln, format!("unknown keyword '{key}'")),
        }
        Ok(())
    }

    fn need_dim(&self, ln: usize, what: &str) -> Result<usize, ParseError> {
        self.dim.map(|(n, _)| n).ok_or_else(|| ParseError {
            line: ln,
            msg: format!("{what} before DIMENSION"),
        })
    }

    /// The data lines of a section: consecutive lines that start with a number; with the
    /// line that ends them and how.
    fn block(&mut self) -> (&'a [(usize, &'a str)], (usize, String)) {
        let lines = self.lines;
        let start = self.next;
        while self.next < lines.len() && is_data(lines[self.next].1) {
            self.next += 1;
        }
        let ended = if self.next < lines.len() {
            let (ln, line) = lines[self.next];
            (ln, format!("'{line}' ends the section"))
        } else {
            (self.end, "the file ends".to_string())
        };
        (&lines[start..self.next], ended)
    }

    fn node_coord_section(&mut self, ln: usize) -> Result<(), ParseError> {
        let n = self.need_dim(ln, "NODE_COORD_SECTION")?;
        if let Some(c) = &self.coords {
            return err(
                ln,
                format!("second NODE_COORD_SECTION (first on line {})", c.line),
            );
        }
        let (data, (end_ln, why)) = self.block();
        self.coords = Some(Coords {
            line: ln,
            xy: read_coords(n, data, end_ln, &why)?,
        });
        Ok(())
    }

    fn edge_weight_section(&mut self, ln: usize) -> Result<(), ParseError> {
        let n = self.need_dim(ln, "EDGE_WEIGHT_SECTION")?;
        let Some((f, _)) = self.wformat else {
            return err(ln, "EDGE_WEIGHT_SECTION before EDGE_WEIGHT_FORMAT");
        };
        if f == WeightFormat::Function {
            return err(
                ln,
                "EDGE_WEIGHT_SECTION, but EDGE_WEIGHT_FORMAT is FUNCTION",
            );
        }
        if let Some((_, first)) = self.weights {
            return err(
                ln,
                format!("second EDGE_WEIGHT_SECTION (first on line {first})"),
            );
        }
        let (data, (end_ln, why)) = self.block();
        self.weights = Some((read_weights(f, n, data, end_ln, &why)?, ln));
        Ok(())
    }

    /// The instance, once the whole file is read: the explicit weights, or the distances
    /// of the coordinates.
    fn into_instance(self) -> Result<Instance, ParseError> {
        let Some((n, _)) = self.dim else {
            return err(self.end, "no DIMENSION in the file");
        };
        let Some((wtype, wtype_ln)) = self.wtype else {
            return err(self.end, "no EDGE_WEIGHT_TYPE in the file");
        };
        let dist = match wtype {
            WeightType::Explicit => {
                if self.wformat.is_none() {
                    return err(
                        wtype_ln,
                        "EDGE_WEIGHT_TYPE is EXPLICIT, but the file has no EDGE_WEIGHT_FORMAT",
                    );
                }
                let Some((w, _)) = self.weights else {
                    return err(
                        wtype_ln,
                        "EDGE_WEIGHT_TYPE is EXPLICIT, but the file has no EDGE_WEIGHT_SECTION",
                    );
                };
                w
            }
            t => {
                let Some(c) = self.coords else {
                    return err(
                        wtype_ln,
                        format!(
                            "EDGE_WEIGHT_TYPE is {}, but the file has no NODE_COORD_SECTION",
                            match t {
                                WeightType::Euc2d => "EUC_2D",
                                WeightType::Ceil2d => "CEIL_2D",
                                WeightType::Geo => "GEO",
                                _ => "ATT",
                            }
                        ),
                    );
                };
                coord_distances(t, n, &c)?
            }
        };
        Ok(Instance::new(self.name, n, dist))
    }
}

fn weight_type(ln: usize, value: &str) -> Result<WeightType, ParseError> {
    Ok(match value {
        "EXPLICIT" => WeightType::Explicit,
        "EUC_2D" => WeightType::Euc2d,
        "CEIL_2D" => WeightType::Ceil2d,
        "GEO" => WeightType::Geo,
        "ATT" => WeightType::Att,
        _ => {
            return err(
                ln,
                format!(
                    "unknown EDGE_WEIGHT_TYPE '{value}' (supported: EXPLICIT, EUC_2D, CEIL_2D, GEO, ATT)"
                ),
            )
        }
    })
}

/// The n x n distance matrix of the coordinates under weight type `t`.
fn coord_distances(t: WeightType, n: usize, c: &Coords) -> Result<Vec<i64>, ParseError> {
    let mut dist = vec![0i64; n * n];
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            let w = coord_distance(t, c.xy[i], c.xy[j]);
            if !(0.0..=MAX_WEIGHT as f64).contains(&w) {
                return err(
                    c.line,
                    format!(
                        "coordinates of nodes {} and {} give a distance out of range",
                        i + 1,
                        j + 1
                    ),
                );
            }
            dist[i * n + j] = w as i64;
        }
    }
    Ok(dist)
}

fn read_coords(
    n: usize,
    data: &[(usize, &str)],
    end_ln: usize,
    why: &str,
) -> Result<Vec<(f64, f64)>, ParseError> {
    let mut xy: Vec<Option<(f64, f64)>> = vec![None; n];
    let mut lines = vec![0usize; n];
    for &(ln, line) in data {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 3 {
            return err(
                ln,
                format!("expected 3 fields (node number, x, y), found {}", f.len()),
            );
        }
        let id: usize = match f[0].parse() {
            Ok(id) if (1..=n).contains(&id) => id,
            _ => return err(ln, format!("node number '{}' is not in 1..={n}", f[0])),
        };
        let mut c = [0.0f64; 2];
        for (v, tok) in c.iter_mut().zip(&f[1..]) {
            *v = match tok.parse::<f64>() {
                Ok(v) if v.is_finite() => v,
                _ => return err(ln, format!("coordinate '{tok}' is not a number")),
            };
        }
        if xy[id - 1].is_some() {
            return err(
                ln,
                format!("node {id} listed twice (first on line {})", lines[id - 1]),
            );
        }
        xy[id - 1] = Some((c[0], c[1]));
        lines[id - 1] = ln;
    }
    if let Some(missing) = xy.iter().position(Option::is_none) {
        let have = xy.iter().filter(|c| c.is_some()).count();
        return err(
            end_ln,
            format!(
                "{why} after {have} of the {n} nodes of the NODE_COORD_SECTION (node {} is missing)",
                missing + 1
            ),
        );
    }
    Ok(xy.into_iter().map(|c| c.unwrap_or_default()).collect())
}

fn read_weights(
    f: WeightFormat,
    n: usize,
    data: &[(usize, &str)],
    end_ln: usize,
    why: &str,
) -> Result<Vec<i64>, ParseError> {
    let cells = f.cells(n);
    let need = cells.len();
    let mut values = Vec::with_capacity(need);
    let mut counts = Vec::with_capacity(data.len());
    for &(ln, line) in data {
        let mut c = 0;
        for tok in line.split_whitespace() {
            values.push((ln, weight(ln, tok)?));
            c += 1;
        }
        counts.push((ln, c));
    }
    if values.len() != need {
        // One row per line with one bad row is the common case: name that line.
        let rows = f.row_lengths(n);
        let bad = counts.iter().zip(&rows).position(|((_, c), r)| c != r);
        if let Some(b) = bad {
            let row_layout = b > 0 || counts.len() == rows.len();
            if row_layout {
                return err(
                    counts[b].0,
                    format!(
                        "expected {} weights, found {} (row {} of a {n}-city {})",
                        rows[b],
                        counts[b].1,
                        b + 1,
                        f.name()
                    ),
                );
            }
        }
        if values.len() < need {
            return err(
                end_ln,
                format!(
                    "{why} after {} of the {need} weights of a {n}-city {} EDGE_WEIGHT_SECTION",
                    values.len(),
                    f.name()
                ),
            );
        }
        return err(
            values[need].0,
            format!(
                "more weights than the {need} of a {n}-city {} (wrong DIMENSION?)",
                f.name()
            ),
        );
    }
    let mut dist = vec![0i64; n * n];
    for (&(i, j), &(_, w)) in cells.iter().zip(&values) {
        if i != j {
            dist[i * n + j] = w;
            if f != WeightFormat::FullMatrix {
                dist[j * n + i] = w;
            }
        }
    }
    Ok(dist)
}

/// TSPLIB's nint: round half up (distances are never negative).
fn nint(x: f64) -> f64 {
    (x + 0.5).floor()
}

/// TSPLIB GEO: `x` is DDD.MM (degrees and minutes), converted to radians with TSPLIB's
/// own PI so distances match the published ones.
fn geo_radians(x: f64) -> f64 {
    // Not std's PI: TSPLIB's published GEO distances are computed with this value.
    #[allow(clippy::approx_constant)]
    const PI: f64 = 3.141592;
    let deg = x.trunc();
    let min = x - deg;
    PI * (deg + 5.0 * min / 3.0) / 180.0
}

/// The distance of a coordinate-based weight type, as a float holding an integer
/// (checked for range by the caller).
fn coord_distance(t: WeightType, a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (a.0 - b.0, a.1 - b.1);
    match t {
        WeightType::Euc2d => nint((dx * dx + dy * dy).sqrt()),
        WeightType::Ceil2d => (dx * dx + dy * dy).sqrt().ceil(),
        WeightType::Att => {
            let r = ((dx * dx + dy * dy) / 10.0).sqrt();
            let t = nint(r);
            if t < r {
                t + 1.0
            } else {
                t
            }
        }
        WeightType::Geo => {
            const RRR: f64 = 6378.388;
            let (lat_a, lon_a) = (geo_radians(a.0), geo_radians(a.1));
            let (lat_b, lon_b) = (geo_radians(b.0), geo_radians(b.1));
            let q1 = (lon_a - lon_b).cos();
            let q2 = (lat_a - lat_b).cos();
            let q3 = (lat_a + lat_b).cos();
            let c = (0.5 * ((1.0 + q1) * q2 - (1.0 - q1) * q3)).clamp(-1.0, 1.0);
            (RRR * c.acos() + 1.0).trunc()
        }
        WeightType::Explicit => unreachable!("explicit weights have no coordinates"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of(r: Result<Instance, ParseError>) -> (usize, String) {
        let e = r.expect_err("should not parse");
        (e.line, e.msg)
    }

    #[test]
    fn random_is_deterministic_and_in_range() {
        let a = random(9, 5, false);
        assert_eq!(a, random(9, 5, false));
        assert_ne!(a.dist, random(9, 6, false).dist);
        assert!(a.is_symmetric());
        let b = random(9, 5, true);
        assert!(!b.is_symmetric());
        for inst in [a, b] {
            for i in 0..9 {
                for j in 0..9 {
                    let w = inst.d(i, j);
                    if i == j {
                        assert_eq!(w, 0);
                    } else {
                        assert!((1..=RANDOM_MAX_WEIGHT).contains(&w));
                    }
                }
            }
        }
    }

    #[test]
    fn matrix_ok() {
        let inst = parse_matrix("3\n0 1 2\n\n3 0 4\n5 6 -1\n").unwrap();
        assert_eq!(inst.n, 3);
        assert_eq!(inst.dist, vec![0, 1, 2, 3, 0, 4, 5, 6, 0]);
        assert_eq!(detect("  3\n0 1 2\n"), Format::Matrix);
        assert_eq!(detect("NAME: x\n"), Format::Tsplib);
    }

    #[test]
    fn matrix_errors_name_the_line() {
        assert_eq!(
            line_of(parse_matrix("3\n0 1 2\n3 0\n5 6 0\n")),
            (3, "expected 3 weights, found 2".into())
        );
        assert_eq!(line_of(parse_matrix("3\n0 1 2\n3 0 x4\n5 6 0\n")).0, 3);
        assert!(line_of(parse_matrix("3\n0 1 2\n3 0 x4\n5 6 0\n"))
            .1
            .contains("'x4' is not an integer"));
        assert_eq!(line_of(parse_matrix("3\n0 1 2\n3 0 4\n")).0, 3);
        assert_eq!(line_of(parse_matrix("2\n0 1\n1 0\n7\n")).0, 4);
        assert_eq!(line_of(parse_matrix("")).0, 1);
        assert_eq!(line_of(parse_matrix("0\n")).0, 1);
        assert!(line_of(parse_matrix("33\n")).1.contains("more than the 32"));
        assert_eq!(line_of(parse_matrix("2 2\n")).0, 1);
        assert!(line_of(parse_matrix("2\n0 99999999999999\n1 0\n"))
            .1
            .contains("out of range"));
    }

    const EUC: &str = "NAME : tiny\nTYPE : TSP\nDIMENSION : 3\nEDGE_WEIGHT_TYPE : EUC_2D\nNODE_COORD_SECTION\n1 0 0\n3 3 4\n2 0 2.5\nEOF\n";

    #[test]
    fn tsplib_euc_2d() {
        let inst = parse_tsplib(EUC).unwrap();
        assert_eq!(inst.name, "tiny");
        // 0-1: 2.5 -> 3 (half up); 0-2: 5; 1-2: sqrt(9 + 2.25) = 3.35 -> 3.
        assert_eq!(inst.dist, vec![0, 3, 5, 3, 0, 3, 5, 3, 0]);
        // EOF is optional.
        assert_eq!(parse_tsplib(&EUC.replace("EOF\n", "")).unwrap(), inst);
        assert_eq!(parse(EUC, Format::Auto).unwrap(), inst);
    }

    #[test]
    fn tsplib_att_and_ceil() {
        let f = |t: &str| {
            parse_tsplib(&format!(
                "DIMENSION: 2\nEDGE_WEIGHT_TYPE: {t}\nNODE_COORD_SECTION\n1 0 0\n2 30 40\n"
            ))
            .unwrap()
            .d(0, 1)
        };
        // ATT: sqrt(2500 / 10) = 15.81 -> nint 16 (not below r); CEIL_2D: ceil(50) = 50.
        assert_eq!(f("ATT"), 16);
        assert_eq!(f("CEIL_2D"), 50);
        assert_eq!(
            coord_distance(WeightType::Att, (0.0, 0.0), (10.0, 0.0)),
            4.0
        );
        assert_eq!(
            coord_distance(WeightType::Att, (0.0, 0.0), (0.0, 30.0)),
            10.0
        );
    }

    /// burma14 from TSPLIB (GEO, 14 cities): its published optimum is 3323.
    const BURMA14: &str = "NAME: burma14\nTYPE: TSP\nCOMMENT: 14-Staedte in Burma (Zaw Win)\nDIMENSION: 14\nEDGE_WEIGHT_TYPE: GEO\nEDGE_WEIGHT_FORMAT: FUNCTION\nDISPLAY_DATA_TYPE: COORD_DISPLAY\nNODE_COORD_SECTION\n   1  16.47       96.10\n   2  16.47       94.44\n   3  20.09       92.54\n   4  22.39       93.37\n   5  25.23       97.24\n   6  22.00       96.05\n   7  20.47       97.02\n   8  17.20       96.29\n   9  16.30       97.38\n  10  14.05       98.12\n  11  16.53       97.38\n  12  21.52       95.59\n  13  19.41       97.13\n  14  20.09       94.55\nEOF\n";

    #[test]
    fn tsplib_geo_burma14_optimum() {
        let inst = parse_tsplib(BURMA14).unwrap();
        assert_eq!(inst.n, 14);
        assert!(inst.is_symmetric());
        assert_eq!(crate::tsp::heldkarp::held_karp(&inst), 3323);
    }

    fn explicit(fmt: &str, n: usize, data: &str) -> Result<Instance, ParseError> {
        parse_tsplib(&format!(
            "NAME: e\nTYPE: TSP\nDIMENSION: {n}\nEDGE_WEIGHT_TYPE: EXPLICIT\nEDGE_WEIGHT_FORMAT: {fmt}\nEDGE_WEIGHT_SECTION\n{data}EOF\n"
        ))
    }

    #[test]
    fn tsplib_explicit_formats_agree() {
        // Symmetric 4-city matrix: d(0,1)=1 d(0,2)=2 d(0,3)=3 d(1,2)=4 d(1,3)=5 d(2,3)=6.
        let want = vec![0, 1, 2, 3, 1, 0, 4, 5, 2, 4, 0, 6, 3, 5, 6, 0];
        let cases = [
            ("FULL_MATRIX", "0 1 2 3\n1 0 4 5\n2 4 0 6\n3 5 6 0\n"),
            ("UPPER_ROW", "1 2 3\n4 5\n6\n"),
            ("LOWER_ROW", "1\n2 4\n3 5 6\n"),
            ("UPPER_DIAG_ROW", "0 1 2 3\n0 4 5\n0 6\n0\n"),
            ("LOWER_DIAG_ROW", "0\n1 0\n2 4 0\n3 5 6 0\n"),
            ("LOWER_DIAG_ROW", "0 1 0 2 4 0 3 5 6 0\n"),
            ("UPPER_COL", "1\n2 4\n3 5 6\n"),
            ("LOWER_COL", "1 2 3\n4 5\n6\n"),
            ("UPPER_DIAG_COL", "0\n1 0\n2 4 0\n3 5 6 0\n"),
            ("LOWER_DIAG_COL", "0 1 2 3 0 4 5 0 6 0\n"),
        ];
        for (fmt, data) in cases {
            let inst = explicit(fmt, 4, data).unwrap_or_else(|e| panic!("{fmt}: {e}"));
            assert_eq!(inst.dist, want, "{fmt}");
        }
        // FULL_MATRIX may be asymmetric (ATSP).
        let a = explicit("FULL_MATRIX", 2, "0 7\n9 0\n").unwrap();
        assert_eq!(a.dist, vec![0, 7, 9, 0]);
    }

    #[test]
    fn tsplib_errors_name_the_line() {
        // Row 2 of a one-row-per-line FULL_MATRIX is short: line 8.
        let (l, m) = line_of(explicit("FULL_MATRIX", 3, "0 1 2\n1 0\n2 4 0\n"));
        assert_eq!(
            (l, m.as_str()),
            (
                8,
                "expected 3 weights, found 2 (row 2 of a 3-city FULL_MATRIX)"
            )
        );
        let (l, m) = line_of(explicit("LOWER_DIAG_ROW", 3, "0\n1 0\n2 x 0\n"));
        assert_eq!(l, 9);
        assert!(m.contains("'x' is not an integer"), "{m}");
        // Too few weights in a packed layout: the line that ends the section (EOF, line 8).
        let (l, m) = line_of(explicit("LOWER_DIAG_ROW", 3, "0 1 0 2 4\n"));
        assert_eq!(l, 8, "{m}");
        assert!(m.contains("5 of the 6 weights"), "{m}");
        // Too many.
        let (l, m) = line_of(explicit("UPPER_ROW", 3, "1 2 3 4\n"));
        assert_eq!(l, 7, "{m}");
        // No EDGE_WEIGHT_SECTION: names the EDGE_WEIGHT_TYPE line.
        let (l, m) = line_of(parse_tsplib(
            "NAME: e\nDIMENSION: 3\nEDGE_WEIGHT_TYPE: EXPLICIT\nEDGE_WEIGHT_FORMAT: FULL_MATRIX\nEOF\n",
        ));
        assert_eq!(l, 3);
        assert!(m.contains("no EDGE_WEIGHT_SECTION"), "{m}");
        // Truncated file (no EOF, section incomplete): names the last line.
        let (l, m) = line_of(parse_tsplib(
            "DIMENSION: 3\nEDGE_WEIGHT_TYPE: EUC_2D\nNODE_COORD_SECTION\n1 0 0\n2 1 1\n",
        ));
        assert_eq!(l, 5);
        assert!(
            m.contains("2 of the 3 nodes") && m.contains("node 3 is missing"),
            "{m}"
        );
        let (l, m) = line_of(parse_tsplib(
            "DIMENSION: 3\nEDGE_WEIGHT_TYPE: MAN_3D\nNODE_COORD_SECTION\n1 0 0\n",
        ));
        assert_eq!(l, 2);
        assert!(m.contains("unknown EDGE_WEIGHT_TYPE 'MAN_3D'"), "{m}");
        let (l, m) = line_of(parse_tsplib("DIMENSION: 40\nEDGE_WEIGHT_TYPE: EUC_2D\n"));
        assert_eq!(l, 1);
        assert!(m.contains("more than the 32"), "{m}");
        let (l, _) = line_of(parse_tsplib(&EUC.replace("3 3 4", "3 3")));
        assert_eq!(l, 7);
        let (l, m) = line_of(parse_tsplib(&EUC.replace("3 3 4", "2 3 4")));
        assert_eq!(
            (l, m.as_str()),
            (8, "node 2 listed twice (first on line 7)")
        );
        let (l, _) = line_of(parse_tsplib(&EUC.replace("3 3 4", "4 3 4")));
        assert_eq!(l, 7);
        let (l, _) = line_of(parse_tsplib(&EUC.replace("3 3 4", "3 3 y")));
        assert_eq!(l, 7);
        let (l, m) = line_of(parse_tsplib(&EUC.replace("TYPE : TSP", "TYPE : CVRP")));
        assert_eq!(l, 2, "{m}");
        let (l, m) = line_of(parse_tsplib(&EUC.replace("NAME : tiny", "FOO: 1")));
        assert_eq!((l, m.as_str()), (1, "unknown keyword 'FOO'"));
        let (l, _) = line_of(parse_tsplib("NODE_COORD_SECTION\n1 0 0\n"));
        assert_eq!(l, 1);
        let (l, m) = line_of(parse_tsplib("DIMENSION: 3\n"));
        assert_eq!(l, 1);
        assert!(m.contains("no EDGE_WEIGHT_TYPE"), "{m}");
        let (l, _) = line_of(parse_tsplib("DIMENSION: x\n"));
        assert_eq!(l, 1);
    }
}
