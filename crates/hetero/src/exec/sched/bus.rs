//! Bus figures of devices without a link model (neither emulated, whose
//! links are modelled, nor the host, whose memory is the host's): a
//! latency and a time per byte for a copy between the device and the host,
//! measured once by a short calibration run (the task layer's, `api/task`)
//! and persisted beside the performance models, one file for every device
//! (`bus.model`, format [`FORMAT`]). A file that does not parse is a warning
//! and a fresh calibration.
//!
//! Plain data: no ops, no devices.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// First line of the bus file.
pub(crate) const FORMAT: &str = "hetero-bus 1";
/// The file's name in the model directory.
const FILE: &str = "bus.model";

/// A device's copies to and from the host: `latency_ns + bytes · ns_per_byte`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BusFigure {
    pub(crate) latency_ns: f64,
    pub(crate) ns_per_byte: f64,
}

impl BusFigure {
    pub(crate) fn transfer_ns(&self, bytes: u64) -> f64 {
        self.latency_ns + bytes as f64 * self.ns_per_byte
    }

    /// The figure from two timed copies: `small` bytes in `t_small` ns and
    /// `large` bytes in `t_large` ns (`large > small`).
    pub(crate) fn from_two(small: u64, t_small: f64, large: u64, t_large: f64) -> BusFigure {
        let per = ((t_large - t_small) / (large - small) as f64).max(1e-3);
        BusFigure {
            latency_ns: (t_small - small as f64 * per).max(0.0),
            ns_per_byte: per,
        }
    }
}

/// The bus figures of one model directory, by device key.
#[derive(Default)]
pub(crate) struct Buses {
    pub(crate) figures: BTreeMap<String, BusFigure>,
    /// Whether the file was found damaged (a warning was given).
    pub(crate) damaged: bool,
    dirty: bool,
}

impl Buses {
    /// The figures saved under `dir` (none when `dir` is `None` or holds
    /// no file).
    pub(crate) fn load(dir: Option<&Path>) -> Buses {
        let Some(dir) = dir else {
            return Buses::default();
        };
        let Some(text) = super::model::read_file(&dir.join(FILE)) else {
            return Buses::default();
        };
        match text.and_then(|t| parse(&t)) {
            Ok(figures) => Buses {
                figures,
                ..Buses::default()
            },
            Err(why) => {
                tracing::warn!(
                    "bus figures in {} are damaged ({why}); calibrating afresh",
                    dir.display()
                );
                Buses {
                    damaged: true,
                    ..Buses::default()
                }
            }
        }
    }

    pub(crate) fn insert(&mut self, key: &str, f: BusFigure) {
        self.figures.insert(key.to_string(), f);
        self.dirty = true;
    }

    /// Writes the file if a figure changed; an error is a warning.
    pub(crate) fn save(&mut self, dir: Option<&PathBuf>) {
        let Some(dir) = dir.filter(|_| self.dirty) else {
            return;
        };
        let mut text = format!("{FORMAT}\n");
        for (k, f) in &self.figures {
            text += &format!("b {k} {:e} {:e}\n", f.latency_ns, f.ns_per_byte);
        }
        let path = dir.join(FILE);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let r = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &path));
        match r {
            Ok(()) => self.dirty = false,
            Err(e) => tracing::warn!("could not save bus figures in {}: {e}", dir.display()),
        }
    }
}

fn parse(text: &str) -> Result<BTreeMap<String, BusFigure>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(FORMAT) {
        return Err(format!("the first line is not '{FORMAT}'"));
    }
    let mut out = BTreeMap::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.is_empty()) {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |s: &str| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("line {}: bad number '{s}'", i + 2))
        };
        match f.as_slice() {
            ["b", key, lat, per] => {
                out.insert(
                    key.to_string(),
                    BusFigure {
                        latency_ns: num(lat)?,
                        ns_per_byte: num(per)?,
                    },
                );
            }
            _ => {
                return Err(format!(
                    "line {}: expected 'b KEY LATENCY NS_PER_BYTE'",
                    i + 2
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_round_trip_and_a_damaged_file_is_empty() {
        let dir = std::env::temp_dir().join(format!("hetero-bus-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut b = Buses::load(Some(&dir));
        assert!(b.figures.is_empty());
        let f = BusFigure::from_two(4096, 14_096.0, 1 << 20, 10_000.0 + (1u64 << 20) as f64);
        assert!((f.ns_per_byte - 1.0).abs() < 1e-9 && (f.latency_ns - 10_000.0).abs() < 1e-6);
        b.insert("vulkan:x:1u", f);
        b.save(Some(&dir));
        let again = Buses::load(Some(&dir));
        assert_eq!(again.figures.get("vulkan:x:1u"), Some(&f));
        std::fs::write(dir.join(FILE), "hetero-bus 1\nb k nan 1\n").unwrap();
        let bad = Buses::load(Some(&dir));
        assert!(bad.damaged && bad.figures.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
