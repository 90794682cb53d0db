//! Red-black successive over-relaxation on an N x N grid: the shared grid is banded by
//! rows across nodes (matching its home distribution, so each node writes only pages it
//! homes), with a barrier after each colour. The update of a point of one colour reads only
//! points of the other colour, so the result is bitwise identical to the sequential
//! computation whatever the node count.

use dsm_core::{band, Array, Dsm, DsmError};

pub const DEFAULT_OMEGA: f64 = 1.5;

/// Initial value of grid point `(i, j)`: fixed boundary (top edge 1.0, other edges 0.0)
/// and a deterministic interior pattern.
pub fn initial(n: usize, i: usize, j: usize) -> f64 {
    if i == 0 {
        1.0
    } else if i == n - 1 || j == 0 || j == n - 1 {
        0.0
    } else {
        ((i * 31 + j * 17) % 97) as f64 / 97.0
    }
}

/// First column of colour `colour` (0 = red: `(i + j)` even) in interior row `i`, and how
/// many points of that colour the row has.
pub fn colour_span(n: usize, i: usize, colour: usize) -> (usize, usize) {
    let j0 = if (i + 1) % 2 == colour { 1 } else { 2 };
    let count = if n > j0 { (n - j0) / 2 } else { 0 };
    (j0, count)
}

#[inline(always)]
fn relax(omega: f64, me: f64, up: f64, down: f64, left: f64, right: f64) -> f64 {
    (1.0 - omega) * me + omega * 0.25 * (up + down + left + right)
}

/// The whole grid in its initial state, row-major.
pub fn initial_grid(n: usize) -> Vec<f64> {
    (0..n * n).map(|k| initial(n, k / n, k % n)).collect()
}

/// Updates the points of colour `colour` in interior row `i` of the row-major `n x n`
/// grid `g` in place: the same `relax` on the same operands as [`run`], on plain slices.
#[inline]
fn relax_row(g: &mut [f64], n: usize, i: usize, colour: usize, omega: f64) {
    let (above, rest) = g.split_at_mut(i * n);
    let (row, below) = rest.split_at_mut(n);
    relax_line(row, &above[(i - 1) * n..], &below[..n], n, i, colour, omega);
}

/// Updates the points of colour `colour` of interior row `i`, held in `row`, with the
/// rows above and below in `up` and `down` (only their points of the other colour are
/// read).
///
/// The row is walked in pairs `[me, right]` starting at the first point of the colour;
/// `left` is the previous pair's `right` (or the point before the first), which this
/// sweep never writes, so carrying it over reads the same value. All slices are cut to
/// exactly `count` pairs up front, so the loop has no bounds checks.
#[inline(always)]
fn relax_line(
    row: &mut [f64],
    up: &[f64],
    down: &[f64],
    n: usize,
    i: usize,
    colour: usize,
    omega: f64,
) {
    let (j0, count) = colour_span(n, i, colour);
    if count == 0 {
        return;
    }
    let span = j0..j0 + 2 * count;
    let up = &up[span.clone()];
    let down = &down[span.clone()];
    let mut left = row[j0 - 1];
    for ((pair, u), d) in row[span]
        .chunks_exact_mut(2)
        .zip(up.chunks_exact(2))
        .zip(down.chunks_exact(2))
    {
        let right = pair[1];
        pair[0] = relax(omega, pair[0], u[0], d[0], left, right);
        left = right;
    }
}

/// The fast sequential computation: `iters` red-black iterations in place on a local
/// row-major grid, with the same updates in the same order as [`run`] (each colour over
/// rows `1..n-1`, red first), hence bitwise the same result. This is the reference both
/// for checking and for timing the speedup.
pub fn iterate(g: &mut [f64], n: usize, iters: usize, omega: f64) {
    assert_eq!(g.len(), n * n, "grid length");
    for _ in 0..iters {
        for colour in 0..2 {
            for i in 1..n.saturating_sub(1) {
                relax_row(g, n, i, colour, omega);
            }
        }
    }
}

/// The sequential reference: [`initial_grid`] followed by [`iterate`].
pub fn sequential(n: usize, iters: usize, omega: f64) -> Vec<f64> {
    let mut g = initial_grid(n);
    iterate(&mut g, n, iters, omega);
    g
}

/// The boundary rows a thread publishes for its neighbours: its band's first and last
/// row, as they stood at the end of a phase.
struct Edges {
    first: Vec<f64>,
    last: Vec<f64>,
}

/// [`iterate`] split over `threads` plain threads of one process (at most `n`; at least
/// 1): the limit that dsm at N ranks on one host can approach. Rows are banded across the
/// threads exactly as [`run`] bands them across nodes ([`band`]), each thread updates the
/// interior rows of its band, and a [`Barrier`](std::sync::Barrier) follows each colour,
/// as dsm's barrier does.
///
/// Each thread owns its band of the grid (`split_at_mut`), so there is no unsafe code:
/// the rows just outside a band are read from copies that their owners publish at the end
/// of every phase (double-buffered by phase parity, so that one barrier per phase
/// suffices). A colour's update reads only points of the other colour, which nobody
/// writes during the phase, so the copies hold exactly what [`iterate`] reads and the
/// result is bitwise the same.
pub fn iterate_threads(g: &mut [f64], n: usize, iters: usize, omega: f64, threads: usize) {
    use std::sync::{Barrier, Mutex};
    assert_eq!(g.len(), n * n, "grid length");
    let threads = threads.clamp(1, n.max(1));
    if n < 3 || iters == 0 {
        return;
    }
    let barrier = Barrier::new(threads);
    let edges = || -> Vec<Mutex<Edges>> {
        (0..threads)
            .map(|_| {
                Mutex::new(Edges {
                    first: vec![0.0; n],
                    last: vec![0.0; n],
                })
            })
            .collect()
    };
    // slots[phase % 2][k]: band k's edge rows at the start of that phase.
    let slots = [edges(), edges()];
    let mut bands = Vec::with_capacity(threads);
    let mut rest = g;
    for k in 0..threads {
        let rows = band(n, threads, k);
        let (mine, tail) = rest.split_at_mut(rows.len() * n);
        bands.push((rows, mine));
        rest = tail;
    }
    let (barrier, slots) = (&barrier, &slots);
    std::thread::scope(|s| {
        for (k, (rows, mine)) in bands.into_iter().enumerate() {
            s.spawn(move || {
                let publish = |mine: &[f64], parity: usize| {
                    let mut e = slots[parity][k].lock().expect("edge lock");
                    e.first.copy_from_slice(&mine[..n]);
                    e.last.copy_from_slice(&mine[mine.len() - n..]);
                };
                let interior = rows.start.max(1)..rows.end.min(n - 1);
                let (mut up, mut down) = (vec![0.0; n], vec![0.0; n]);
                publish(mine, 0);
                barrier.wait();
                let mut phase = 0;
                for _ in 0..iters {
                    for colour in 0..2 {
                        let parity = phase % 2;
                        if k > 0 {
                            up.copy_from_slice(
                                &slots[parity][k - 1].lock().expect("edge lock").last,
                            );
                        }
                        if k + 1 < threads {
                            down.copy_from_slice(
                                &slots[parity][k + 1].lock().expect("edge lock").first,
                            );
                        }
                        for i in interior.clone() {
                            let li = i - rows.start;
                            let (above, rest) = mine.split_at_mut(li * n);
                            let (row, below) = rest.split_at_mut(n);
                            let u = if li == 0 {
                                &up[..]
                            } else {
                                &above[(li - 1) * n..]
                            };
                            let d = if below.is_empty() {
                                &down[..]
                            } else {
                                &below[..n]
                            };
                            relax_line(row, u, d, n, i, colour, omega);
                        }
                        phase += 1;
                        publish(mine, phase % 2);
                        barrier.wait();
                    }
                }
            });
        }
    });
}

/// The straightforward sequential loop (indexing the whole grid point by point), kept as
/// an independent check of [`iterate`]; too slow to be a timing baseline.
pub fn sequential_simple(n: usize, iters: usize, omega: f64) -> Vec<f64> {
    let mut g = initial_grid(n);
    for _ in 0..iters {
        for colour in 0..2 {
            for i in 1..n - 1 {
                let (j0, count) = colour_span(n, i, colour);
                for k in 0..count {
                    let j = j0 + 2 * k;
                    let x = relax(
                        omega,
                        g[i * n + j],
                        g[(i - 1) * n + j],
                        g[(i + 1) * n + j],
                        g[i * n + j - 1],
                        g[i * n + j + 1],
                    );
                    g[i * n + j] = x;
                }
            }
        }
    }
    g
}

/// Rows this node initialises and updates: its band of the grid (so it writes only the
/// pages it homes).
pub fn my_rows(dsm: &Dsm, n: usize) -> std::ops::Range<usize> {
    band(n, dsm.size(), dsm.rank())
}

/// Allocates and initialises the grid (collective).
pub fn setup(dsm: &mut Dsm, n: usize) -> Result<Array<f64>, DsmError> {
    let grid = dsm.alloc_2d::<f64>("grid", n, n)?;
    {
        let g = dsm.view(&grid);
        let mut row = vec![0.0; n];
        for i in my_rows(dsm, n) {
            for (j, x) in row.iter_mut().enumerate() {
                *x = initial(n, i, j);
            }
            g.write_row(i, &row);
        }
    }
    dsm.barrier()?;
    Ok(grid)
}

/// A deliberate bug for testing value-trace comparison (`sor --inject-bug E,R,C`): the
/// node owning row `row` adds 1.0 to element `(row, col)` just before the program's
/// `epoch`-th barrier (the grid's initialisation is barrier 1, so `epoch` >= 2), so the
/// trace point of barrier `epoch` is the first to differ. Epoch `e` updates colour
/// `(e - 2) % 2` (red: `row + col` even); an element of that colour is read by no node
/// during the epoch, so only it differs at barrier `epoch`. An element of the other colour
/// may be read meanwhile by a neighbouring node (the injection races), and its neighbours
/// may differ too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inject {
    /// The barrier before which the element is perturbed.
    pub epoch: u32,
    /// Row of the element.
    pub row: usize,
    /// Column of the element.
    pub col: usize,
}

/// Runs `iters` red-black iterations on the shared grid.
///
/// What each phase reads and writes is declared in a few bulk views, so race detection
/// costs little: this node's own rows as one block read, the neighbours' boundary rows as
/// strided reads of exactly the points used (the neighbour writes the other colour of
/// them meanwhile), and each row's writes as a strided write of its colour.
pub fn run(
    dsm: &mut Dsm,
    grid: &Array<f64>,
    n: usize,
    iters: usize,
    omega: f64,
) -> Result<(), DsmError> {
    run_with(dsm, grid, n, iters, omega, None)
}

/// [`run`], with a perturbation injected (see [`Inject`]).
pub fn run_with(
    dsm: &mut Dsm,
    grid: &Array<f64>,
    n: usize,
    iters: usize,
    omega: f64,
    inject: Option<Inject>,
) -> Result<(), DsmError> {
    let band = my_rows(dsm, n);
    // Barriers the program has called: setup's is the first.
    let mut barriers = 1u32;
    let interior = band.start.max(1)..band.end.min(n - 1);
    for _ in 0..iters {
        for colour in 0..2 {
            if !interior.is_empty() {
                let g = dsm.view(grid);
                let own = g.block(band.clone());
                for i in interior.clone() {
                    let (j0, count) = colour_span(n, i, colour);
                    if count == 0 {
                        continue;
                    }
                    let up = if i - 1 < band.start {
                        g.strided((i - 1) * n + j0, 2, count)
                    } else {
                        own.strided(i - 1, j0, 2, count)
                    };
                    let down = if i + 1 >= band.end {
                        g.strided((i + 1) * n + j0, 2, count)
                    } else {
                        own.strided(i + 1, j0, 2, count)
                    };
                    let sides = own.strided(i, j0 - 1, 2, count + 1);
                    let me = own.strided(i, j0, 2, count);
                    let out = g.strided_mut(i * n + j0, 2, count);
                    for k in 0..count {
                        let x = relax(
                            omega,
                            me.get(k),
                            up.get(k),
                            down.get(k),
                            sides.get(k),
                            sides.get(k + 1),
                        );
                        out.set(k, x);
                    }
                }
            }
            barriers += 1;
            if let Some(bug) = inject.filter(|b| b.epoch == barriers && band.contains(&b.row)) {
                let g = dsm.view(grid);
                g.set2(bug.row, bug.col, g.get2(bug.row, bug.col) + 1.0);
            }
            dsm.barrier()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn fast_kernel_is_bitwise_the_simple_loop() {
        for n in (3..=13).chain([32, 33, 64]) {
            for iters in [0, 1, 2, 7] {
                for omega in [DEFAULT_OMEGA, 1.0, 1.93] {
                    assert_eq!(
                        bits(&sequential(n, iters, omega)),
                        bits(&sequential_simple(n, iters, omega)),
                        "n {n}, {iters} iterations, omega {omega}"
                    );
                }
            }
        }
    }

    #[test]
    fn threaded_kernel_is_bitwise_the_sequential_one() {
        for n in [3, 4, 5, 8, 13, 33, 64] {
            for iters in [0, 1, 3] {
                let want = sequential(n, iters, DEFAULT_OMEGA);
                for threads in [1, 2, 3, 4, 7, n, n + 5] {
                    let mut g = initial_grid(n);
                    iterate_threads(&mut g, n, iters, DEFAULT_OMEGA, threads);
                    assert_eq!(
                        bits(&g),
                        bits(&want),
                        "n {n}, {iters} iterations, {threads} threads"
                    );
                }
            }
        }
    }

    #[test]
    fn boundary_is_untouched_and_interior_moves() {
        let n = 9;
        let g = sequential(n, 3, DEFAULT_OMEGA);
        for i in 0..n {
            for j in 0..n {
                if i == 0 || i == n - 1 || j == 0 || j == n - 1 {
                    assert_eq!(g[i * n + j].to_bits(), initial(n, i, j).to_bits());
                }
            }
        }
        assert_ne!(bits(&g), bits(&initial_grid(n)));
    }
}
