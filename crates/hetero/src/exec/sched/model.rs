//! History-based performance models with StarPU's semantics: per kernel, per
//! device and per footprint (the sizes of the task's data), the mean of the
//! observed execution times, trusted after [`TRUSTED_AFTER`] samples; per
//! kernel and device a regression `a·n^b + c` over the total data size `n`
//! (fitted to the footprints' means once three sizes vary enough; before
//! that `a·n^b` over every sample), used for footprints without a trusted
//! history.
//!
//! Outliers: a sample more than [`OUTLIER_FACTOR`] times the median of the
//! recent accepted samples (or less than its inverse) is rejected and counted,
//! so a rare inflated sample (starpu#50: one in a hundred 300× slower) moves
//! neither the mean nor the regression. [`REGIME_AFTER`] rejections in a row
//! mean the device really changed: the history restarts from them.
//!
//! Persistence: one file per kernel under the model directory
//! (`HETERO_PERFMODEL_DIR`, else `$XDG_CACHE_HOME/hetero/perfmodels`, else
//! `$HOME/.cache/hetero/perfmodels`), a versioned text format (see
//! [`FORMAT`]). A file that does not parse is a warning and a fresh
//! calibration of that kernel, never an error.
//!
//! Plain data: no ops, no devices; the task layer (`api/task`) feeds it.

use crate::exec::kernel::KernelName;
use rustc_hash::FxHashMap as HashMap;
use std::path::{Path, PathBuf};

/// Samples before a history is trusted (StarPU's `STARPU_CALIBRATE_MINIMUM`).
pub(crate) const TRUSTED_AFTER: u64 = 10;
/// A sample past this factor of the recent median (either way) is an outlier.
pub(crate) const OUTLIER_FACTOR: f64 = 4.0;
/// Outliers in a row that are taken as a new regime rather than noise.
pub(crate) const REGIME_AFTER: u32 = 6;
/// Accepted samples the median is taken over.
const RECENT: usize = 15;
/// The regression is used once the largest size seen is this factor of the
/// smallest (and it has `TRUSTED_AFTER` samples).
const SIZE_SPREAD: f64 = 1.5;
/// First line of a model file; bump the number when the format changes (an
/// older file is then recalibrated, with a warning).
pub(crate) const FORMAT: &str = "hetero-perfmodel 1";

/// One (kernel, device, footprint)'s history.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct History {
    /// Accepted samples.
    pub(crate) n: u64,
    /// Their mean, ns.
    pub(crate) mean: f64,
    /// Welford's sum of squared deviations.
    m2: f64,
    /// Rejected samples (outliers).
    pub(crate) rejected: u64,
    /// Outliers in a row (a regime change at `REGIME_AFTER`).
    streak: Vec<f64>,
    /// The last accepted samples, for the median.
    recent: Window,
    /// Data size of the footprint, bytes.
    size: u64,
}

/// The last [`RECENT`] accepted samples: in arrival order (a ring) and in
/// `total_cmp` order (kept sorted as samples come and go), so the median is
/// one read; every observation asks for it. Fixed arrays: no allocation,
/// and the shifts stay within one small block of memory.
#[derive(Clone, Debug, Default, PartialEq)]
struct Window {
    ring: [f64; RECENT],
    /// Where the oldest sample is (0 until the window is full).
    head: usize,
    len: usize,
    sorted: [f64; RECENT],
}

impl Window {
    fn from_oldest_first(samples: &[f64]) -> Window {
        let mut w = Window::default();
        for &x in samples.iter().take(RECENT) {
            w.push(x);
        }
        w
    }

    /// The samples, oldest first.
    fn oldest_first(&self) -> impl Iterator<Item = f64> + '_ {
        (0..self.len).map(move |i| self.ring[(self.head + i) % RECENT])
    }

    fn median(&self) -> Option<f64> {
        (self.len >= 3).then(|| self.sorted[self.len / 2])
    }

    /// Adds `x`, dropping the oldest sample when full.
    fn push(&mut self, x: f64) {
        if self.len < RECENT {
            self.ring[self.len] = x;
            let at = self.sorted[..self.len].partition_point(|v| v.total_cmp(&x).is_le());
            self.sorted.copy_within(at..self.len, at + 1);
            self.sorted[at] = x;
            self.len += 1;
            return;
        }
        let old = std::mem::replace(&mut self.ring[self.head], x);
        self.head = (self.head + 1) % RECENT;
        // Equal under `total_cmp` is the same bits: any match will do.
        let i = self
            .sorted
            .iter()
            .position(|v| v.to_bits() == old.to_bits())
            .expect("the sorted copy holds the ring's samples");
        // `x` takes the place `old` leaves: only the samples between the
        // two places move, one step towards `old`'s.
        let at = self.sorted.partition_point(|v| v.total_cmp(&x).is_le());
        if at <= i {
            // Those from `at` up to `old` are above `x`.
            self.sorted.copy_within(at..i, at + 1);
            self.sorted[at] = x;
        } else {
            // `old` is at or below `x`; those after it up to `at` are too.
            self.sorted.copy_within(i + 1..at, i);
            self.sorted[at - 1] = x;
        }
    }
}

impl History {
    fn median(&self) -> Option<f64> {
        self.recent.median()
    }

    /// Adds a sample; false when it was rejected as an outlier.
    fn add(&mut self, ns: f64) -> bool {
        if let Some(m) = self.median() {
            let far = ns > m * OUTLIER_FACTOR || ns * OUTLIER_FACTOR < m;
            if far {
                self.streak.push(ns);
                if self.streak.len() < REGIME_AFTER as usize {
                    self.rejected += 1;
                    return false;
                }
                // A new regime: restart from the samples of the streak.
                let streak = std::mem::take(&mut self.streak);
                let (size, rejected) = (self.size, self.rejected);
                *self = History {
                    size,
                    rejected,
                    ..History::default()
                };
                for s in streak {
                    self.accept(s);
                }
                return true;
            }
        }
        self.streak.clear();
        self.accept(ns);
        true
    }

    fn accept(&mut self, ns: f64) {
        self.n += 1;
        let d = ns - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (ns - self.mean);
        self.recent.push(ns);
    }

    pub(crate) fn trusted(&self) -> bool {
        self.n >= TRUSTED_AFTER
    }
}

/// Least squares of `ln t = ln a + b ln n` over accepted samples.
#[derive(Clone, Debug, Default, PartialEq)]
struct Regression {
    k: u64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    min_n: f64,
    max_n: f64,
}

impl Regression {
    fn add(&mut self, n: f64, ns: f64) {
        if n <= 0.0 || ns <= 0.0 {
            return;
        }
        let (x, y) = (n.ln(), ns.ln());
        if self.k == 0 {
            self.min_n = n;
            self.max_n = n;
        }
        self.k += 1;
        self.sx += x;
        self.sy += y;
        self.sxx += x * x;
        self.sxy += x * y;
        self.min_n = self.min_n.min(n);
        self.max_n = self.max_n.max(n);
    }

    /// `(a, b)` once the sizes vary enough.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.k < TRUSTED_AFTER || self.max_n < self.min_n * SIZE_SPREAD {
            return None;
        }
        let k = self.k as f64;
        let den = k * self.sxx - self.sx * self.sx;
        if den.abs() < 1e-12 {
            return None;
        }
        let b = (k * self.sxy - self.sx * self.sy) / den;
        let a = ((self.sy - b * self.sx) / k).exp();
        Some((a, b))
    }
}

/// A device as the models know it: its key (what the files name) and its
/// index in the context (what look-ups go by: no string hashed per task).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dev<'a> {
    pub(crate) index: usize,
    pub(crate) key: &'a str,
}

/// One kernel's models on every device it ran on.
#[derive(Clone, Debug, Default)]
struct KernelModel {
    /// By device key, in the order first seen.
    devices: Vec<(String, DeviceModel)>,
    /// Per device index: its model's place in `devices` plus one (0: not
    /// found yet). One context's models: an index names one key.
    at: Vec<u32>,
    /// Unsaved samples since the last save.
    dirty: bool,
}

impl KernelModel {
    /// `dev`'s model's place in `devices`.
    fn find(&mut self, dev: Dev<'_>) -> Option<usize> {
        if let Some(&i) = self.at.get(dev.index).filter(|&&i| i != 0) {
            return Some(i as usize - 1);
        }
        let i = self.devices.iter().position(|(k, _)| k == dev.key)?;
        if self.at.len() <= dev.index {
            self.at.resize(dev.index + 1, 0);
        }
        self.at[dev.index] = i as u32 + 1;
        Some(i)
    }

    /// The model of the device keyed `key`, made empty if there is none.
    fn keyed(&mut self, key: &str) -> &mut DeviceModel {
        let i = match self.devices.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                self.devices.push((key.to_string(), DeviceModel::default()));
                self.devices.len() - 1
            }
        };
        &mut self.devices[i].1
    }
}

/// One kernel's models on one device: one look-up of the device key finds
/// all three.
#[derive(Clone, Debug, Default, PartialEq)]
struct DeviceModel {
    /// By footprint.
    history: HashMap<u64, History>,
    /// Over every accepted sample (`None` before the first).
    regression: Option<Regression>,
    /// The fit of `a·n^b + c` over the histories' means (made when first
    /// asked after a change: `None` until then; `Some(None)`: too few
    /// sizes).
    fit: Option<Option<(f64, f64, f64)>>,
}

/// What a prediction rests on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Basis {
    /// The footprint's own trusted history.
    History,
    /// The kernel's regression on this device.
    Regression,
}

/// Steps of the constant term the `a·n^b + c` fit tries, from 0 to just
/// under the smallest mean.
const C_STEPS: usize = 48;

/// StarPU's non-linear regression `t = a·n^b + c` over the means of a
/// kernel's footprints on one device (`n`: data size), each weighted by its
/// samples: for each `c` of a grid below the smallest mean, least squares of
/// `ln(t − c) = ln a + b ln n`; the `c` whose fit leaves the smallest
/// squared error in `t` wins. `None` until there are three sizes spread by
/// [`SIZE_SPREAD`] and [`TRUSTED_AFTER`] samples in all. The constant is the
/// fixed cost a power law alone bends to fit (a launch, a setup).
fn fit_with_constant(hist: &HashMap<u64, History>) -> Option<(f64, f64, f64)> {
    let pts: Vec<(f64, f64, f64)> = hist
        .values()
        .filter(|h| h.n > 0 && h.size > 0 && h.mean > 0.0)
        .map(|h| (h.size as f64, h.mean, h.n as f64))
        .collect();
    let mut sizes: Vec<f64> = pts.iter().map(|p| p.0).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    let samples: f64 = pts.iter().map(|p| p.2).sum();
    if sizes.len() < 3
        || sizes[sizes.len() - 1] < sizes[0] * SIZE_SPREAD
        || samples < TRUSTED_AFTER as f64
    {
        return None;
    }
    let t_min = pts.iter().map(|p| p.1).fold(f64::MAX, f64::min);
    let mut best: Option<(f64, (f64, f64, f64))> = None;
    for k in 0..C_STEPS {
        let c = t_min * k as f64 / C_STEPS as f64;
        let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(n, t, w) in &pts {
            let (x, y) = (n.ln(), (t - c).ln());
            sw += w;
            sx += w * x;
            sy += w * y;
            sxx += w * x * x;
            sxy += w * x * y;
        }
        let den = sw * sxx - sx * sx;
        if den.abs() < 1e-12 {
            return None;
        }
        let b = (sw * sxy - sx * sy) / den;
        let a = ((sy - b * sx) / sw).exp();
        let err: f64 = pts
            .iter()
            .map(|&(n, t, w)| w * (t - (a * n.powf(b) + c)).powi(2))
            .sum();
        if a.is_finite() && b.is_finite() && best.is_none_or(|(e, _)| err < e) {
            best = Some((err, (a, b, c)));
        }
    }
    best.map(|(_, f)| f)
}

/// All kernels' models, loaded from and saved to one directory.
pub(crate) struct Models {
    dir: Option<PathBuf>,
    /// Per kernel, in the order first asked.
    kernels: Vec<(KernelName, KernelModel)>,
    /// Each kernel's place in `kernels`.
    index: HashMap<KernelName, usize>,
    /// The place of the kernel last asked for: a task's candidates and
    /// observations ask for one kernel several times in a row.
    last: usize,
    /// Files found damaged (each was a warning and a fresh calibration).
    pub(crate) damaged: u64,
    /// Kernels whose models were found on disk.
    pub(crate) loaded: u64,
    /// Outliers rejected, in all models.
    pub(crate) rejected: u64,
    /// The bus figures of the same directory (loaded when first asked).
    buses: Option<super::bus::Buses>,
    /// Per device index, the last lookup and its answer, until the next
    /// observation (the only change to what a lookup answers): a task's
    /// candidates ask for the same kernel and sizes as the task before.
    memo: Vec<Option<Memo>>,
}

/// A lookup's question and answer (`Models::memo`).
#[derive(Clone, Copy)]
struct Memo {
    kernel: KernelName,
    /// The device's key, by address (the runtime's, fixed for its life).
    key: usize,
    footprint: u64,
    size: u64,
    answer: (Option<(f64, Basis)>, u64),
}

/// The directory models persist in: `HETERO_PERFMODEL_DIR`, else the user's
/// cache directory (`$XDG_CACHE_HOME` or `$HOME/.cache`) + `hetero/perfmodels`.
pub(crate) fn default_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HETERO_PERFMODEL_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("hetero").join("perfmodels"))
}

/// The footprint of data sizes (StarPU hashes the sizes of the task's data).
pub(crate) fn footprint(sizes: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for s in sizes {
        for b in s.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl Models {
    /// Models persisted under `dir` (`None`: in memory only).
    pub(crate) fn new(dir: Option<PathBuf>) -> Self {
        Models {
            dir,
            kernels: Vec::new(),
            index: HashMap::default(),
            last: 0,
            damaged: 0,
            loaded: 0,
            rejected: 0,
            buses: None,
            memo: Vec::new(),
        }
    }

    /// The bus figures persisted beside the models.
    pub(crate) fn buses(&mut self) -> &mut super::bus::Buses {
        if self.buses.is_none() {
            let b = super::bus::Buses::load(self.dir.as_deref());
            // A damaged file counts with the damaged model files.
            self.damaged += u64::from(b.damaged);
            self.buses = Some(b);
        }
        self.buses.as_mut().expect("loaded above")
    }

    /// The file of `kernel`'s models: its name where that is a short plain
    /// file name, else its first `NAME_MAX` safe characters and a hash of
    /// the whole name (so `gemm<f32>` and `gemm[f32]`, or two long names
    /// that share a start, keep a file each: one file for both left each
    /// kernel finding the other's and calibrating afresh every run).
    fn file(dir: &Path, kernel: &str) -> PathBuf {
        const NAME_MAX: usize = 64;
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if kernel.len() <= NAME_MAX && !kernel.is_empty() && kernel.chars().all(plain) {
            return dir.join(format!("{kernel}.model"));
        }
        let safe: String = kernel
            .chars()
            .take(NAME_MAX)
            .map(|c| if plain(c) { c } else { '_' })
            .collect();
        // FNV-1a: stable across runs and builds (the std hasher is not).
        let hash = kernel.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        dir.join(format!("{safe}-{hash:016x}.model"))
    }

    fn kernel(&mut self, kernel: KernelName) -> &mut KernelModel {
        if !self
            .kernels
            .get(self.last)
            .is_some_and(|(k, _)| *k == kernel)
        {
            self.last = match self.index.get(&kernel) {
                Some(&at) => at,
                None => {
                    let m = self.load(kernel);
                    self.kernels.push((kernel, m));
                    self.index.insert(kernel, self.kernels.len() - 1);
                    self.kernels.len() - 1
                }
            };
        }
        &mut self.kernels[self.last].1
    }

    /// `kernel`'s models from the directory, else fresh ones.
    fn load(&mut self, kernel: KernelName) -> KernelModel {
        let Some(dir) = &self.dir else {
            return KernelModel::default();
        };
        let kernel = kernel.text;
        match read_file(&Self::file(dir, kernel)) {
            Some(text) => match text.and_then(|t| parse(&t, kernel)) {
                Ok(m) => {
                    self.loaded += 1;
                    m
                }
                Err(why) => {
                    self.damaged += 1;
                    tracing::warn!(
                        "performance model of kernel '{kernel}' in {} is damaged ({why}); \
                         calibrating it afresh",
                        dir.display()
                    );
                    KernelModel::default()
                }
            },
            None => KernelModel::default(),
        }
    }

    /// Predicted ns of `kernel` on `device` for data of `footprint` and total
    /// `size` bytes; `None` while uncalibrated.
    pub(crate) fn predict(
        &mut self,
        kernel: KernelName,
        device: Dev<'_>,
        footprint: u64,
        size: u64,
    ) -> Option<(f64, Basis)> {
        self.lookup(kernel, device, footprint, size).0
    }

    /// [`predict`](Self::predict) and [`samples`](Self::samples) in one
    /// look-up (the submission path asks both per candidate device).
    pub(crate) fn lookup(
        &mut self,
        kernel: KernelName,
        device: Dev<'_>,
        footprint: u64,
        size: u64,
    ) -> (Option<(f64, Basis)>, u64) {
        let key = device.key.as_ptr() as usize;
        let asked =
            |m: &Memo| (m.kernel, m.key, m.footprint, m.size) == (kernel, key, footprint, size);
        match self.memo.get(device.index) {
            Some(Some(m)) if asked(m) => m.answer,
            _ => {
                let answer = self.answer(kernel, device, footprint, size);
                if self.memo.len() <= device.index {
                    self.memo.resize(device.index + 1, None);
                }
                self.memo[device.index] = Some(Memo {
                    kernel,
                    key,
                    footprint,
                    size,
                    answer,
                });
                answer
            }
        }
    }

    /// `lookup`'s answer from the models.
    fn answer(
        &mut self,
        kernel: KernelName,
        device: Dev<'_>,
        footprint: u64,
        size: u64,
    ) -> (Option<(f64, Basis)>, u64) {
        let k = self.kernel(kernel);
        let Some(at) = k.find(device) else {
            return (None, 0);
        };
        let m = &mut k.devices[at].1;
        let h = m.history.get(&footprint);
        let samples = h.map_or(0, |h| h.n);
        if let Some(h) = h.filter(|h| h.trusted()) {
            return (Some((h.mean, Basis::History)), samples);
        }
        // a·n^b + c over the footprints' means once they vary enough, else
        // the power law over every sample.
        let n = size as f64;
        if let Some((a, b, c)) = *m.fit.get_or_insert_with(|| fit_with_constant(&m.history)) {
            return (Some((a * n.powf(b) + c, Basis::Regression)), samples);
        }
        let fit = m.regression.as_ref().and_then(Regression::fit);
        (
            fit.map(|(a, b)| (a * n.powf(b), Basis::Regression)),
            samples,
        )
    }

    /// Accepted samples of the footprint's history.
    #[cfg(test)]
    pub(crate) fn samples(&mut self, kernel: KernelName, device: Dev<'_>, footprint: u64) -> u64 {
        let k = self.kernel(kernel);
        k.find(device)
            .and_then(|at| k.devices[at].1.history.get(&footprint))
            .map_or(0, |h| h.n)
    }

    /// Records an observed execution time.
    pub(crate) fn observe(
        &mut self,
        kernel: KernelName,
        device: Dev<'_>,
        footprint: u64,
        size: u64,
        ns: f64,
    ) {
        self.memo.clear();
        let m = self.kernel(kernel);
        m.dirty = true;
        let at = match m.find(device) {
            Some(at) => at,
            None => {
                m.keyed(device.key);
                m.find(device).expect("added")
            }
        };
        let d = &mut m.devices[at].1;
        let h = d.history.entry(footprint).or_insert_with(|| History {
            size,
            ..History::default()
        });
        let accepted = h.add(ns);
        d.fit = None;
        if accepted {
            d.regression
                .get_or_insert_with(Regression::default)
                .add(size as f64, ns);
        } else {
            self.rejected += 1;
        }
    }

    /// Writes every model changed since the last save; errors are warnings
    /// (a model that cannot be saved is recalibrated next run).
    pub(crate) fn save(&mut self) {
        if let Some(b) = &mut self.buses {
            b.save(self.dir.as_ref());
        }
        let Some(dir) = self.dir.clone() else { return };
        for (name, m) in self.kernels.iter_mut().filter(|(_, m)| m.dirty) {
            let name = name.text;
            let r = std::fs::create_dir_all(&dir).and_then(|()| {
                // Write beside and rename: a crash never leaves half a file.
                let path = Self::file(&dir, name);
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                std::fs::write(&tmp, render(name, m))?;
                std::fs::rename(&tmp, &path)
            });
            match r {
                Ok(()) => m.dirty = false,
                Err(e) => tracing::warn!(
                    "could not save the performance model of kernel '{name}' in {}: {e}",
                    dir.display()
                ),
            }
        }
    }
}

/// The most a model file may hold (a kernel's models take a few KiB): a
/// larger one is damaged, so that a stray huge file, or a name that is a
/// device such as `/dev/zero`, never fills memory.
const FILE_MAX: u64 = 16 << 20;

/// A model file's text: `None` where there is none (or it cannot be
/// opened), else its text or why it is damaged (too large, unreadable, not
/// UTF-8).
pub(crate) fn read_file(path: &Path) -> Option<Result<String, String>> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    if let Err(e) = file.take(FILE_MAX + 1).read_to_end(&mut bytes) {
        return Some(Err(format!("unreadable: {e}")));
    }
    if bytes.len() as u64 > FILE_MAX {
        return Some(Err(format!("larger than {} MiB", FILE_MAX >> 20)));
    }
    Some(String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into()))
}

fn render(name: &str, m: &KernelModel) -> String {
    let mut s = format!("{FORMAT}\nkernel {name}\n");
    let mut hist: Vec<_> = m
        .devices
        .iter()
        .flat_map(|(dev, d)| d.history.iter().map(move |(fp, h)| ((dev, fp), h)))
        .collect();
    hist.sort_by(|a, b| a.0.cmp(&b.0));
    for ((dev, fp), h) in hist {
        let recent: Vec<String> = h.recent.oldest_first().map(|x| format!("{x:e}")).collect();
        s += &format!(
            "h {dev} {fp} {} {} {:e} {:e} {} {}\n",
            h.size,
            h.n,
            h.mean,
            h.m2,
            h.rejected,
            recent.join(",")
        );
    }
    let mut regs: Vec<_> = m
        .devices
        .iter()
        .filter_map(|(dev, d)| d.regression.as_ref().map(|r| (dev, r)))
        .collect();
    regs.sort_by(|a, b| a.0.cmp(b.0));
    for (dev, r) in regs {
        s += &format!(
            "r {dev} {} {:e} {:e} {:e} {:e} {:e} {:e}\n",
            r.k, r.sx, r.sy, r.sxx, r.sxy, r.min_n, r.max_n
        );
    }
    s
}

fn parse(text: &str, kernel: &str) -> Result<KernelModel, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(FORMAT) => {}
        Some(other) => return Err(format!("first line '{other}', expected '{FORMAT}'")),
        None => return Err("empty file".into()),
    }
    match lines.next() {
        Some(l) if l == format!("kernel {kernel}") => {}
        _ => return Err(format!("second line does not name kernel '{kernel}'")),
    }
    let num = |s: Option<&str>, what: &str| -> Result<f64, String> {
        let v: f64 = s
            .ok_or_else(|| format!("missing {what}"))?
            .parse()
            .map_err(|_| format!("bad {what}"))?;
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("{what} out of range"))
        }
    };
    let mut m = KernelModel::default();
    for (i, line) in lines.enumerate() {
        let mut f = line.split(' ');
        let at = |e: String| format!("line {}: {e}", i + 3);
        match f.next() {
            Some("h") => {
                let dev = f
                    .next()
                    .ok_or_else(|| at("missing device".into()))?
                    .to_string();
                let fp: u64 = f
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| at("bad footprint".into()))?;
                let size = num(f.next(), "size").map_err(at)? as u64;
                let n = num(f.next(), "count").map_err(at)? as u64;
                let mean = num(f.next(), "mean").map_err(at)?;
                let m2 = num(f.next(), "m2").map_err(at)?;
                let rejected = num(f.next(), "rejected").map_err(at)? as u64;
                let recent = match f.next() {
                    Some("") | None => Vec::new(),
                    Some(list) => list
                        .split(',')
                        .map(|x| num(Some(x), "recent sample"))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(at)?,
                };
                if recent.len() > RECENT || (n > 0 && recent.is_empty()) {
                    return Err(at("recent samples do not match the count".into()));
                }
                m.keyed(&dev).history.insert(
                    fp,
                    History {
                        n,
                        mean,
                        m2,
                        rejected,
                        streak: Vec::new(),
                        recent: Window::from_oldest_first(&recent),
                        size,
                    },
                );
            }
            Some("r") => {
                let dev = f
                    .next()
                    .ok_or_else(|| at("missing device".into()))?
                    .to_string();
                let k = num(f.next(), "count").map_err(at)? as u64;
                // Sums of logarithms may be negative.
                let mut v = [0.0; 6];
                for x in &mut v {
                    *x = f
                        .next()
                        .and_then(|s| s.parse::<f64>().ok())
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| at("bad regression sum".into()))?;
                }
                m.keyed(&dev).regression = Some(Regression {
                    k,
                    sx: v[0],
                    sy: v[1],
                    sxx: v[2],
                    sxy: v[3],
                    min_n: v[4],
                    max_n: v[5],
                });
            }
            Some("") => {}
            Some(other) => return Err(at(format!("unknown record '{other}'"))),
            None => {}
        }
        if f.next().is_some() {
            return Err(at("trailing fields".into()));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: KernelName = KernelName { id: 0, text: "k" };
    const K1: KernelName = KernelName { id: 1, text: "k-1" };
    const D: Dev<'static> = Dev { index: 0, key: "d" };
    const EMU: Dev<'static> = Dev {
        index: 1,
        key: "emu:x",
    };

    proptest::proptest! {
        /// The window's ring and sorted arrays say what a list of the last
        /// `RECENT` samples says (values from a small set: ties, and
        /// samples leaving that equal others still in).
        #[test]
        fn the_window_is_the_last_samples_in_order_and_sorted(
            xs in proptest::collection::vec(0u8..6, 0..60)
        ) {
            let mut w = Window::default();
            let mut last: Vec<f64> = Vec::new();
            for x in xs {
                let x = f64::from(x) * 0.5;
                w.push(x);
                last.push(x);
                if last.len() > RECENT {
                    last.remove(0);
                }
                let mut sorted = last.clone();
                sorted.sort_by(f64::total_cmp);
                proptest::prop_assert_eq!(w.oldest_first().collect::<Vec<_>>(), last.clone());
                proptest::prop_assert_eq!(&w.sorted[..w.len], &sorted[..]);
                let median = (sorted.len() >= 3).then(|| sorted[sorted.len() / 2]);
                proptest::prop_assert_eq!(w.median(), median);
            }
        }
    }

    #[test]
    fn trusted_after_ten_samples() {
        let mut m = Models::new(None);
        for i in 0..TRUSTED_AFTER {
            assert!(m.predict(K, D, 1, 100).is_none(), "after {i}");
            m.observe(K, D, 1, 100, 1000.0);
        }
        assert_eq!(m.predict(K, D, 1, 100), Some((1000.0, Basis::History)));
    }

    #[test]
    fn outliers_do_not_move_the_mean_and_a_new_regime_does() {
        let mut m = Models::new(None);
        for i in 0..200 {
            let ns = if i % 100 == 50 { 300_000.0 } else { 1000.0 };
            m.observe(K, D, 1, 100, ns);
        }
        assert_eq!(m.predict(K, D, 1, 100).map(|p| p.0), Some(1000.0));
        assert_eq!(m.rejected, 2);
        for _ in 0..REGIME_AFTER {
            m.observe(K, D, 1, 100, 5000.0);
        }
        assert_eq!(m.samples(K, D, 1), u64::from(REGIME_AFTER));
        for _ in 0..TRUSTED_AFTER {
            m.observe(K, D, 1, 100, 5000.0);
        }
        assert_eq!(m.predict(K, D, 1, 100).map(|p| p.0), Some(5000.0));
    }

    #[test]
    fn regression_predicts_unseen_sizes() {
        let mut m = Models::new(None);
        for i in 0..20u64 {
            let n = 1000 + 100 * (i % 10);
            // t = 2 n^1.5
            m.observe(K, D, n, n, 2.0 * (n as f64).powf(1.5));
        }
        let (t, basis) = m.predict(K, D, 99, 4000).expect("fitted");
        assert_eq!(basis, Basis::Regression);
        let want = 2.0 * 4000f64.powf(1.5);
        assert!((t / want - 1.0).abs() < 1e-6, "{t} vs {want}");
    }

    #[test]
    fn the_regression_finds_a_constant_term() {
        let mut m = Models::new(None);
        let t = |n: f64| 2.0 * n.powf(1.5) + 50_000.0;
        for i in 0..40u64 {
            let n = 1000 * (1 + i % 4);
            m.observe(K, D, n, n, t(n as f64));
        }
        // A size never seen: the constant matters (a power law alone is
        // off by more than a third here).
        let (p, basis) = m.predict(K, D, 99, 250).expect("fitted");
        assert_eq!(basis, Basis::Regression);
        assert!((p / t(250.0) - 1.0).abs() < 0.05, "{p} vs {}", t(250.0));
        let (a, b, c) = fit_with_constant(&m.kernel(K).devices[0].1.history).unwrap();
        assert!(
            (b - 1.5).abs() < 0.05 && (c / 50_000.0 - 1.0).abs() < 0.1,
            "{a} {b} {c}"
        );
    }

    #[test]
    fn a_saved_model_loads_and_a_damaged_one_is_fresh() {
        let dir = std::env::temp_dir().join(format!("hetero-model-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut m = Models::new(Some(dir.clone()));
        for _ in 0..TRUSTED_AFTER {
            m.observe(K1, EMU, 7, 64, 500.0);
        }
        m.save();
        let mut again = Models::new(Some(dir.clone()));
        assert_eq!(again.predict(K1, EMU, 7, 64).map(|p| p.0), Some(500.0));
        assert_eq!((again.loaded, again.damaged), (1, 0));
        std::fs::write(
            Models::file(&dir, "k-1"),
            "hetero-perfmodel 1\nkernel k-1\nh x 1 nan\n",
        )
        .unwrap();
        let mut damaged = Models::new(Some(dir.clone()));
        assert_eq!(damaged.predict(K1, EMU, 7, 64), None);
        assert_eq!(damaged.damaged, 1);
        // Not text, and past the size a model file may have: damaged too
        // (never read whole into memory).
        let file = Models::file(&dir, "k-1");
        std::fs::write(&file, [0xff, 0xfe, 0x00]).unwrap();
        let mut binary = Models::new(Some(dir.clone()));
        assert_eq!(binary.predict(K1, EMU, 7, 64), None);
        assert_eq!(binary.damaged, 1);
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(FILE_MAX + 4096))
            .unwrap();
        let mut huge = Models::new(Some(dir.clone()));
        assert_eq!(huge.predict(K1, EMU, 7, 64), None);
        assert_eq!(huge.damaged, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Names that differ only in characters a file name cannot hold, or past
    /// a file name's length, keep a model each: a shared file made each
    /// kernel find the other's (damaged, calibrated afresh every run), and a
    /// name past 255 bytes could not be saved at all.
    #[test]
    fn kernels_whose_names_a_file_name_cannot_tell_apart_keep_a_model_each() {
        let dir = std::env::temp_dir().join(format!("hetero-model-names-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Two names of 301 bytes that differ in the last (a file name holds
        // 255 at most); statics, as kernel names are.
        use std::sync::LazyLock;
        static LONG_A: LazyLock<String> = LazyLock::new(|| format!("{}a", "k".repeat(300)));
        static LONG_B: LazyLock<String> = LazyLock::new(|| format!("{}b", "k".repeat(300)));
        let (long_a, long_b): (&'static str, &'static str) = (&LONG_A, &LONG_B);
        let names = [
            "gemm<f32>",
            "gemm[f32]",
            "gemm_f32_",
            "ä",
            "ö",
            long_a,
            long_b,
        ];
        let kernels: Vec<KernelName> = (0..names.len())
            .map(|i| KernelName {
                id: 10 + i as u32,
                text: names[i],
            })
            .collect();
        let mut m = Models::new(Some(dir.clone()));
        for (i, &k) in kernels.iter().enumerate() {
            for _ in 0..TRUSTED_AFTER {
                m.observe(k, EMU, 7, 64, 100.0 * (i + 1) as f64);
            }
        }
        m.save();
        let mut again = Models::new(Some(dir.clone()));
        for (i, &k) in kernels.iter().enumerate() {
            let p = again.predict(k, EMU, 7, 64).map(|p| p.0);
            assert_eq!(p, Some(100.0 * (i + 1) as f64), "{}", k.text);
        }
        assert_eq!((again.loaded, again.damaged), (names.len() as u64, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
