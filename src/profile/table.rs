//! Compact tables keyed by prompt block, for profiles with millions of distinct blocks.
//!
//! A file's `hash_ids` are small integers handed out from 0 in order of first use, so a
//! table indexed by id ([`IdTable`]) costs the value's size per block, where a hash map
//! costs two to four times that (entry padding, control bytes, power-of-two growth). Only
//! blocks whose key appears under more than one id (across files, see
//! [`Profile::shared_keys`](super::Profile::shared_keys)) are identified by key; they go
//! in a hash map, which stays as small as the prefixes the files have in common.

use std::collections::HashMap;

use super::read::BlockId;

/// Ids further than this beyond the highest dense one go to the hash map instead (a
/// file with sparse ids costs no more than a map).
const GAP: usize = 1 << 16;

/// Values by `hash_ids` id: a vector for ids from 0 up, a hash map for ids far beyond
/// and for values equal to `empty` (the vector's marker for "none").
#[derive(Debug, Clone)]
pub struct IdTable<T> {
    dense: Vec<T>,
    sparse: HashMap<u32, T>,
    empty: T,
}

impl<T: Copy + PartialEq> IdTable<T> {
    pub fn new(empty: T) -> Self {
        IdTable {
            dense: Vec::new(),
            sparse: HashMap::new(),
            empty,
        }
    }

    pub fn get(&self, id: u32) -> Option<T> {
        match self.dense.get(id as usize) {
            Some(v) if *v != self.empty => Some(*v),
            _ => self.sparse.get(&id).copied(),
        }
    }

    pub fn insert(&mut self, id: u32, value: T) {
        let i = id as usize;
        if value != self.empty && i < self.dense.len() + GAP {
            if i >= self.dense.len() {
                self.dense.resize(i + 1, self.empty);
            }
            self.dense[i] = value;
            if !self.sparse.is_empty() {
                self.sparse.remove(&id);
            }
        } else {
            if let Some(v) = self.dense.get_mut(i) {
                *v = self.empty;
            }
            self.sparse.insert(id, value);
        }
    }

    /// Every value held (in no particular order).
    pub fn values(&self) -> impl Iterator<Item = T> + '_ {
        let empty = self.empty;
        self.dense
            .iter()
            .copied()
            .filter(move |v| *v != empty)
            .chain(self.sparse.values().copied())
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.values().count()
    }

    pub fn is_empty(&self) -> bool {
        self.values().next().is_none()
    }
}

/// Values by [`BlockId`]: file-local blocks in one [`IdTable`] per file, keyed ones in a
/// hash map.
pub struct BlockMap<T> {
    files: Vec<IdTable<T>>,
    keys: HashMap<u64, T>,
    empty: T,
}

impl<T: Copy + PartialEq> BlockMap<T> {
    /// `empty`: a value never inserted in practice (kept exact if it is, in a map).
    pub fn new(empty: T) -> Self {
        BlockMap {
            files: Vec::new(),
            keys: HashMap::new(),
            empty,
        }
    }

    pub fn get(&self, b: BlockId) -> Option<T> {
        match b {
            BlockId::Key(k) => self.keys.get(&k).copied(),
            BlockId::Local(file, id) => self.files.get(file)?.get(id),
        }
    }

    pub fn insert(&mut self, b: BlockId, value: T) {
        match b {
            BlockId::Key(k) => {
                self.keys.insert(k, value);
            }
            BlockId::Local(file, id) => {
                if file >= self.files.len() {
                    self.files
                        .resize_with(file + 1, || IdTable::new(self.empty));
                }
                self.files[file].insert(id, value);
            }
        }
    }

    /// The value of `b`, set to `make()` first when there is none.
    pub fn get_or_insert_with(&mut self, b: BlockId, make: impl FnOnce() -> T) -> T {
        if let Some(v) = self.get(b) {
            return v;
        }
        let v = make();
        self.insert(b, v);
        v
    }
}

/// The blocks seen so far (prefix reuse): one byte per file-local block.
pub struct BlockSet(BlockMap<bool>);

impl Default for BlockSet {
    fn default() -> Self {
        BlockSet(BlockMap::new(false))
    }
}

impl BlockSet {
    /// Adds `b`; `true` when it was not there yet.
    pub fn insert(&mut self, b: BlockId) -> bool {
        if self.0.get(b).is_some() {
            return false;
        }
        self.0.insert(b, true);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_sparse_and_empty_values_all_read_back() {
        let mut t = IdTable::new(u64::MAX);
        t.insert(0, 7);
        t.insert(3, 9);
        t.insert(4_000_000_000, 1); // far beyond: the map
        t.insert(5, u64::MAX); // the marker itself: the map
        assert_eq!(t.get(0), Some(7));
        assert_eq!(t.get(1), None);
        assert_eq!(t.get(3), Some(9));
        assert_eq!(t.get(5), Some(u64::MAX));
        assert_eq!(t.get(4_000_000_000), Some(1));
        assert_eq!(t.get(6), None);
        assert!(t.dense.len() < 10, "a far id does not grow the vector");
        // Overwrites move between the two without leaving a stale value behind.
        t.insert(5, 2);
        assert_eq!(t.get(5), Some(2));
        t.insert(3, u64::MAX);
        assert_eq!(t.get(3), Some(u64::MAX));
        let mut all: Vec<u64> = t.values().collect();
        all.sort_unstable();
        assert_eq!(all, [1, 2, 7, u64::MAX]);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn block_maps_keep_files_and_keys_apart() {
        let mut m = BlockMap::new(u32::MAX);
        assert_eq!(m.get_or_insert_with(BlockId::Local(2, 5), || 1), 1);
        assert_eq!(m.get_or_insert_with(BlockId::Local(2, 5), || 9), 1);
        assert_eq!(m.get(BlockId::Local(0, 5)), None);
        assert_eq!(m.get(BlockId::Key(5)), None);
        m.insert(BlockId::Key(5), 3);
        assert_eq!(m.get(BlockId::Key(5)), Some(3));
        let mut seen = BlockSet::default();
        assert!(seen.insert(BlockId::Local(1, 0)));
        assert!(!seen.insert(BlockId::Local(1, 0)));
        assert!(seen.insert(BlockId::Local(0, 0)));
        assert!(seen.insert(BlockId::Key(0)));
        assert!(!seen.insert(BlockId::Key(0)));
    }
}
