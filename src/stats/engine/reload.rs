//! Config reload without losing the windows. When the window lengths and input buckets are
//! unchanged, the slices still mean the same thing, so the engine keeps them: classes are
//! matched by name (targets and order updated, data kept), new classes start empty, removed
//! classes are dropped (and leave `overall` with them); cost, `min_samples`, `history` and
//! `timeline_points` apply at once, to the data already held. Any other change starts a
//! fresh engine.

use super::{Engine, EngineConfig};

impl Engine {
    /// Applies `cfg`, keeping what still means the same thing (see the module doc). Returns
    /// whether the existing data was kept.
    pub fn reconfigure(&mut self, cfg: EngineConfig) -> bool {
        let fresh = Engine::new(cfg);
        let same = self.bounds == fresh.bounds
            && self.cap_geom == fresh.cap_geom
            && self.windows.len() == fresh.windows.len()
            && self
                .windows
                .iter()
                .zip(&fresh.windows)
                .all(|(a, b)| a.geom == b.geom);
        if !same {
            *self = fresh;
            return false;
        }
        let mut old = std::mem::take(&mut self.classes);
        self.classes = fresh
            .classes
            .into_iter()
            .map(
                |new| match old.iter().position(|o| o.cfg.name == new.cfg.name) {
                    Some(i) => {
                        let mut kept = old.swap_remove(i);
                        kept.cfg = new.cfg;
                        kept
                    }
                    None => new,
                },
            )
            .collect();
        for (w, f) in self.windows.iter_mut().zip(&fresh.windows) {
            w.series_cap = f.series_cap;
            w.series.trim(f.series_cap);
        }
        for c in &mut self.classes {
            for (s, w) in c.series.iter_mut().zip(&self.windows) {
                s.trim(w.series_cap);
            }
        }
        self.retain_splits();
        self.timeline.set_cap(fresh.timeline.cap);
        self.min_samples = fresh.min_samples;
        self.cost = fresh.cost;
        true
    }
}
