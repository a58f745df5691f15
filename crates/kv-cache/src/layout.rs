//! Layer groups of a hybrid KV cache (as vLLM's hybrid KV cache manager):
//! layers that attend the same way (globally, or through the same sliding
//! window) form a group, and each group gets its own block table per
//! sequence, so a sliding group can give back blocks that left its window.
//!
//! All groups draw from one pool of *pages*. A page holds the K/V of
//! `page_layers` layers for `block_size` positions, `page_layers` being the
//! greatest common divisor of the group sizes; a group of `n ×
//! page_layers` layers takes `n` pages per logical block (one per slice of
//! `page_layers` of its layers). So a page is interchangeable between
//! groups and the pool needs no split decided in advance. A model without
//! windows has one group of all its layers and one page per block: the
//! plain paged cache.

/// Marks a table entry whose block left the window and went back to the
/// pool; no position in it is read again.
pub const NULL_BLOCK: u32 = u32::MAX;

/// One group: its layers and their window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroup {
    /// Keys older than this many positions are never read; `None`: global.
    pub window: Option<usize>,
    /// The model layers of the group, ascending.
    pub layers: Vec<usize>,
}

/// Where a layer's K/V lives: its group, which of the runner's
/// `page_layers` K/V tensors, and which page of each logical block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSite {
    /// Index of the layer's group (and of its block table).
    pub group: usize,
    /// Index of the K/V tensor (of `page_layers`) the layer uses.
    pub slice: usize,
    /// The layer reads page `block * pages_per_block + part` of its table.
    pub part: usize,
    /// Pages per logical block of the group.
    pub pages_per_block: usize,
}

/// The groups of a model's layers and how pages are shared between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    groups: Vec<KvGroup>,
    page_layers: usize,
    sites: Vec<LayerSite>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl KvLayout {
    /// One global group of `num_layers` layers: one page per block.
    pub fn single(num_layers: usize) -> Self {
        Self::from_windows(&vec![None; num_layers.max(1)])
    }

    /// Groups the layers by their window (`windows[layer]`): the global
    /// layers first, then one group per distinct window size.
    pub fn from_windows(windows: &[Option<usize>]) -> Self {
        let mut keys: Vec<Option<usize>> = windows.to_vec();
        keys.sort();
        keys.dedup();
        let groups: Vec<KvGroup> = keys
            .into_iter()
            .map(|window| KvGroup {
                window,
                layers: (0..windows.len())
                    .filter(|&l| windows[l] == window)
                    .collect(),
            })
            .collect();
        let page_layers = groups.iter().fold(0, |g, x| gcd(g, x.layers.len()));
        let mut sites = vec![
            LayerSite {
                group: 0,
                slice: 0,
                part: 0,
                pages_per_block: 1
            };
            windows.len()
        ];
        for (g, group) in groups.iter().enumerate() {
            for (i, &layer) in group.layers.iter().enumerate() {
                sites[layer] = LayerSite {
                    group: g,
                    slice: i % page_layers,
                    part: i / page_layers,
                    pages_per_block: group.layers.len() / page_layers,
                };
            }
        }
        Self {
            groups,
            page_layers,
            sites,
        }
    }

    /// The groups; group `g` owns block table `g` of every sequence.
    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    /// Layers whose K/V one page holds.
    pub fn page_layers(&self) -> usize {
        self.page_layers
    }

    /// Pages group `g` takes per logical block.
    pub fn pages_per_block(&self, g: usize) -> usize {
        self.groups[g].layers.len() / self.page_layers
    }

    /// Where layer `layer` reads and writes its K/V.
    pub fn site(&self, layer: usize) -> LayerSite {
        self.sites[layer]
    }

    /// The first logical block group `g` still needs when the next position
    /// to compute is `next`: a query at `next` or later never sees keys
    /// before `next + 1 - window`.
    pub fn first_live_block(&self, g: usize, next: usize, block_size: usize) -> usize {
        match self.groups[g].window {
            Some(w) => (next + 1).saturating_sub(w) / block_size,
            None => 0,
        }
    }

    /// Pages a sequence holds while computing positions `start..end` (none
    /// of them before): every group's live blocks up to `end`.
    pub fn pages_for(&self, start: usize, end: usize, block_size: usize) -> usize {
        let blocks = end.div_ceil(block_size);
        (0..self.groups.len())
            .map(|g| {
                let live = blocks.saturating_sub(self.first_live_block(g, start, block_size));
                live * self.pages_per_block(g)
            })
            .sum()
    }

    /// Pages a sequence of `len` positions may hold at its fullest step,
    /// computed in chunks of at most `max_chunk`: a sliding group never
    /// holds more than its window plus a chunk (and a block each side).
    /// Grows with `len`.
    pub fn max_pages(&self, len: usize, block_size: usize, max_chunk: usize) -> usize {
        let blocks = len.div_ceil(block_size);
        (0..self.groups.len())
            .map(|g| {
                let live = match self.groups[g].window {
                    Some(w) => blocks.min((w + max_chunk.max(1)).div_ceil(block_size) + 1),
                    None => blocks,
                };
                live * self.pages_per_block(g)
            })
            .sum()
    }

    /// The longest sequence a pool of `num_pages` can always run, computed
    /// in chunks of at most `max_chunk` positions.
    pub fn capacity_tokens(&self, num_pages: usize, block_size: usize, max_chunk: usize) -> usize {
        let (mut lo, mut hi) = (
            0usize,
            num_pages.saturating_mul(block_size).saturating_add(1),
        );
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if self.max_pages(mid, block_size, max_chunk) <= num_pages {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 270M: 18 layers, every sixth global, window 512.
    fn gemma() -> KvLayout {
        let windows: Vec<_> = (0..18).map(|l| ((l + 1) % 6 != 0).then_some(512)).collect();
        KvLayout::from_windows(&windows)
    }

    #[test]
    fn a_model_without_windows_is_one_group_of_one_page_per_block() {
        let l = KvLayout::single(30);
        assert_eq!(l.groups().len(), 1);
        assert_eq!(l.page_layers(), 30);
        assert_eq!(l.pages_per_block(0), 1);
        assert_eq!(
            l.site(7),
            LayerSite {
                group: 0,
                slice: 7,
                part: 0,
                pages_per_block: 1
            }
        );
        assert_eq!(l.pages_for(100, 4096, 16), 256);
        assert_eq!(l.capacity_tokens(10, 16, 2048), 160);
    }

    #[test]
    fn gemma_layers_split_into_a_global_and_a_sliding_group() {
        let l = gemma();
        assert_eq!(l.groups()[0].layers, vec![5, 11, 17]);
        assert_eq!(l.groups()[1].window, Some(512));
        assert_eq!(l.page_layers(), 3);
        assert_eq!((l.pages_per_block(0), l.pages_per_block(1)), (1, 5));
        // Sliding layers 0..=4, 6..=10, ... in order: the 4th sliding
        // layer (model layer 3) is slice 0 of part 1.
        assert_eq!(l.site(3).group, 1);
        assert_eq!((l.site(3).slice, l.site(3).part), (0, 1));
        assert_eq!((l.site(11).group, l.site(11).slice), (0, 1));
        // Decoding at 4095: 256 global blocks, 33 live sliding blocks × 5.
        assert_eq!(l.first_live_block(1, 4095, 16), 224);
        assert_eq!(l.pages_for(4095, 4096, 16), 256 + 32 * 5);
        // Short sequences hold all their blocks in both groups.
        assert_eq!(l.pages_for(0, 100, 16), 7 * 6);
    }

    #[test]
    fn capacity_counts_the_window_and_the_chunk() {
        let l = gemma();
        // 6 pages per block for short sequences, then 1 per block plus the
        // window's (and a chunk's) sliding blocks.
        let cap = l.capacity_tokens(600, 16, 256);
        assert!(cap > 600 / 6 * 16, "windows free pages: {cap}");
        // Every step of every shorter sequence fits.
        for len in 1..=cap {
            let start = len.saturating_sub(256);
            assert!(l.pages_for(start, len, 16) <= 600, "{len}");
            assert!(l.pages_for(len - 1, len, 16) <= 600, "{len}");
        }
        assert!(l.max_pages(cap + 1, 16, 256) > 600);
        // 49 live sliding blocks of 5 pages, the rest global blocks.
        assert_eq!(cap, (600 - 49 * 5) * 16);
    }
}
