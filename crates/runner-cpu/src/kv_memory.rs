//! KV cache memory that comes and goes with the model.

use std::ops::{Deref, DerefMut};

/// Zeroed f32 slots in their own anonymous memory map. Allocating costs
/// nothing up front (pages arrive zeroed on first touch) and freeing hands
/// the memory back to the OS at once. A `Vec` of this size would, after a
/// sleeping model freed its KV, come from the allocator's heap (glibc raises
/// its mmap threshold after large frees) and be zeroed by hand: ~0.2 s per
/// GiB on every wake.
pub struct KvSlots {
    map: Option<memmap2::MmapMut>,
    len: usize,
}

impl KvSlots {
    /// `len` zeroed slots.
    pub fn zeroed(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self::empty());
        }
        let map = memmap2::MmapMut::map_anon(len * std::mem::size_of::<f32>())?;
        Ok(Self {
            map: Some(map),
            len,
        })
    }

    /// No slots (a sleeping model's).
    pub fn empty() -> Self {
        Self { map: None, len: 0 }
    }

    /// Slots holding `values` (tests).
    #[cfg(test)]
    pub fn from_values(values: &[f32]) -> std::io::Result<Self> {
        let mut s = Self::zeroed(values.len())?;
        s.copy_from_slice(values);
        Ok(s)
    }
}

impl Deref for KvSlots {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.map {
            // SAFETY: the map is page-aligned, `len` f32s long, and lives
            // as long as the borrow of self.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr().cast::<f32>(), self.len) },
            None => &[],
        }
    }
}

impl DerefMut for KvSlots {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.map {
            // SAFETY: as in `deref`, borrowed mutably through self.
            Some(m) => unsafe {
                std::slice::from_raw_parts_mut(m.as_mut_ptr().cast::<f32>(), self.len)
            },
            None => &mut [],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_start_zeroed_hold_writes_and_can_be_empty() {
        let mut s = KvSlots::zeroed(1000).unwrap();
        assert_eq!(s.len(), 1000);
        assert!(s.iter().all(|&x| x == 0.0));
        s[999] = 2.5;
        assert_eq!(s[999], 2.5);
        assert!(KvSlots::empty().is_empty());
        assert_eq!(&*KvSlots::from_values(&[1.0, 2.0]).unwrap(), &[1.0, 2.0]);
    }
}
