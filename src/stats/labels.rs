//! Bounded metric label values. Model names come from clients, so the set of values is
//! capped: the first N distinct models keep their name, the rest are reported as `other`.
//! Each value is interned: a request's label is a reference count, not a new string.

use std::collections::HashSet;

use crate::metrics::Name;

/// Longest model name kept as a label value; longer ones are cut (on a char boundary).
const MAX_LABEL_LEN: usize = 128;

#[derive(Debug)]
pub struct ModelLabels {
    seen: HashSet<Name>,
    max: usize,
    unknown: Name,
    other: Name,
}

impl ModelLabels {
    pub fn new(max: usize) -> ModelLabels {
        ModelLabels {
            seen: HashSet::new(),
            max,
            unknown: "unknown".into(),
            other: "other".into(),
        }
    }

    /// The label value for a request's model.
    pub fn label(&mut self, model: Option<&str>) -> Name {
        let Some(model) = model else {
            return self.unknown.clone();
        };
        let mut end = model.len().min(MAX_LABEL_LEN);
        while !model.is_char_boundary(end) {
            end -= 1;
        }
        let model = &model[..end];
        if let Some(name) = self.seen.get(model) {
            return name.clone();
        }
        if self.seen.len() < self.max {
            let name: Name = model.into();
            self.seen.insert(name.clone());
            return name;
        }
        self.other.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_distinct_values() {
        let mut l = ModelLabels::new(2);
        assert_eq!(&*l.label(Some("a")), "a");
        assert_eq!(&*l.label(Some("b")), "b");
        assert_eq!(&*l.label(Some("c")), "other");
        assert_eq!(&*l.label(Some("a")), "a");
        assert_eq!(&*l.label(None), "unknown");
        // Interned: the same name is the same allocation every time.
        assert!(std::sync::Arc::ptr_eq(
            &l.label(Some("a")),
            &l.label(Some("a"))
        ));
    }

    #[test]
    fn long_names_are_cut_on_char_boundaries() {
        let mut l = ModelLabels::new(5);
        let long = "é".repeat(100);
        let label = l.label(Some(&long));
        assert!(label.len() <= MAX_LABEL_LEN && label.chars().all(|c| c == 'é'));
    }
}
