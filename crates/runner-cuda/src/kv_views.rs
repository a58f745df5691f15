//! Which KV buffer and which block table each layer reads, in the grouped
//! layout of `ingot_kv_cache` (see docs/kv-cache.md): the runner keeps
//! `page_layers` K/V buffer pairs of `num_pages` pages each, and stages one
//! table per *view*, a (group, page part) pair: view `v`'s table lists, per
//! logical block, the page that part of the group reads. The attention and
//! KV-write kernels index a table by logical block, so they read a view's
//! table as they read the single table of a one-group model.
//!
//! A model without sliding windows has one view (the first group's table
//! as it is) and one buffer pair per layer: exactly the layout that existed
//! before groups.

use ingot_kv_cache::{KvLayout, NULL_BLOCK};
use ingot_models::ModelConfig;
use ingot_runner::SequenceChunk;

/// Where a layer's K/V lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerView {
    /// The staged table (and KV-write slots) the layer reads.
    pub view: usize,
    /// The K/V buffer pair (of `page_layers`) the layer uses.
    pub slice: usize,
}

/// The views of a model's [`KvLayout`].
#[derive(Debug, Clone)]
pub(crate) struct KvViews {
    layout: KvLayout,
    /// `(group, part)` of each view, the groups' parts in order.
    views: Vec<(usize, usize)>,
}

impl KvViews {
    /// The views of `config`'s layout ([`ingot_runner::kv_layout_of`], as
    /// the CPU runner and the scheduler use).
    pub fn of(config: &ModelConfig) -> Self {
        Self::new(ingot_runner::kv_layout_of(config))
    }

    pub fn new(layout: KvLayout) -> Self {
        let views = (0..layout.groups().len())
            .flat_map(|g| (0..layout.pages_per_block(g)).map(move |part| (g, part)))
            .collect();
        Self { layout, views }
    }

    /// The layout the scheduler's tables follow.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Tables staged per step (1 without sliding windows).
    pub fn count(&self) -> usize {
        self.views.len()
    }

    /// K/V buffer pairs: one per layer of a page.
    pub fn slices(&self) -> usize {
        self.layout.page_layers()
    }

    /// The view and buffer pair of model layer `layer`.
    pub fn of_layer(&self, layer: usize) -> LayerView {
        let site = self.layout.site(layer);
        let view = self
            .views
            .iter()
            .position(|&gp| gp == (site.group, site.part))
            .unwrap_or(0);
        LayerView {
            view,
            slice: site.slice,
        }
    }

    /// The table of view `v`'s group in `chunk` and that group's pages per
    /// block (an empty table for a group the chunk lacks, which
    /// `validate_grouped` rejects before any step).
    fn group_table<'a>(&self, chunk: &SequenceChunk<'a>, v: usize) -> (&'a [u32], usize, usize) {
        let (g, part) = self.views[v];
        let table = match g {
            0 => chunk.block_table,
            _ => chunk
                .group_tables
                .get(g - 1)
                .map_or(&[][..], |t| t.blocks()),
        };
        (table, self.layout.pages_per_block(g), part)
    }

    /// Logical blocks `chunk`'s tables cover (the longest of its groups).
    pub fn blocks_of(&self, chunk: &SequenceChunk<'_>) -> usize {
        (0..self.count())
            .map(|v| {
                let (table, ppb, _) = self.group_table(chunk, v);
                table.len() / ppb
            })
            .max()
            .unwrap_or(0)
    }

    /// The page view `v` of `chunk` reads for logical block `block`;
    /// `scratch` for a block given back (never read: it left the window).
    pub fn page(&self, chunk: &SequenceChunk<'_>, v: usize, block: usize, scratch: u32) -> u32 {
        let (table, ppb, part) = self.group_table(chunk, v);
        match table.get(block * ppb + part) {
            Some(&NULL_BLOCK) | None => scratch,
            Some(&page) => page,
        }
    }

    /// View `v`'s table of `chunk`, one page per logical block (given-back
    /// blocks as `scratch`).
    pub fn pages<'a>(
        &'a self,
        chunk: &'a SequenceChunk<'_>,
        v: usize,
        scratch: u32,
    ) -> impl Iterator<Item = u32> + 'a {
        let (table, ppb, part) = self.group_table(chunk, v);
        table
            .iter()
            .skip(part)
            .step_by(ppb)
            .map(move |&p| if p == NULL_BLOCK { scratch } else { p })
    }
}

/// How many pages the KV pool needs and holds, in the model's layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvSizing<'a> {
    pub layout: &'a KvLayout,
    pub num_layers: usize,
    pub max_context: usize,
    pub block_size: usize,
    /// Most tokens of one step (the longest chunk).
    pub max_tokens: usize,
}

impl KvSizing<'_> {
    /// Pages holding `tokens` positions of every layer (`kv_cache_tokens`;
    /// the CPU runner's rule): blocks without sliding windows.
    pub fn pages_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size) * self.num_layers / self.layout.page_layers()
    }

    /// The fewest pages the pool must have: one sequence of the longest
    /// step (of the context, when shorter), which the profiling pass runs.
    pub fn need(&self) -> usize {
        let len = self.max_context.min(self.max_tokens);
        self.layout.max_pages(len, self.block_size, self.max_tokens)
    }

    /// The longest sequence `pages` pages always run.
    pub fn capacity_tokens(&self, pages: usize) -> usize {
        self.layout
            .capacity_tokens(pages, self.block_size, self.max_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 270M: 18 layers, every sixth global, window 512.
    fn gemma() -> KvViews {
        let windows: Vec<_> = (0..18).map(|l| ((l + 1) % 6 != 0).then_some(512)).collect();
        KvViews::new(KvLayout::from_windows(&windows))
    }

    #[test]
    fn a_llama_model_has_one_view_and_a_buffer_pair_per_layer() {
        let v = KvViews::new(KvLayout::single(32));
        assert_eq!((v.count(), v.slices()), (1, 32));
        for layer in 0..32 {
            assert_eq!(
                v.of_layer(layer),
                LayerView {
                    view: 0,
                    slice: layer
                }
            );
        }
        // The table is the block table as it is.
        let table = [7, 3, 9];
        let chunk = SequenceChunk {
            tokens: &[1],
            start_pos: 40,
            block_table: &table,
            group_tables: &[],
        };
        assert_eq!(v.pages(&chunk, 0, 99).collect::<Vec<_>>(), table);
        assert_eq!(v.page(&chunk, 0, 2, 99), 9);
        assert_eq!(v.blocks_of(&chunk), 3);
        let sizing = KvSizing {
            layout: v.layout(),
            num_layers: 32,
            max_context: 8192,
            block_size: 16,
            max_tokens: 2048,
        };
        // Blocks of every layer, as before groups.
        assert_eq!(sizing.pages_for_tokens(1600), 100);
        assert_eq!(sizing.need(), 128);
        assert_eq!(sizing.capacity_tokens(100), 1600);
    }

    #[test]
    fn gemma_layers_read_their_group_part_and_slice() {
        let v = gemma();
        // Global group: 1 part; sliding group: 5 parts.
        assert_eq!((v.count(), v.slices()), (6, 3));
        // Global layers 5, 11, 17: view 0, slices 0, 1, 2.
        for (i, layer) in [5, 11, 17].into_iter().enumerate() {
            assert_eq!(v.of_layer(layer), LayerView { view: 0, slice: i });
        }
        // Sliding layers in order (0..=4, 6..=10, 12..=16): the i-th is
        // part i / 3 (view 1 + i / 3), slice i % 3.
        let sliding = (0..18).filter(|l| (l + 1) % 6 != 0);
        for (i, layer) in sliding.enumerate() {
            let expect = LayerView {
                view: 1 + i / 3,
                slice: i % 3,
            };
            assert_eq!(v.of_layer(layer), expect, "layer {layer}");
        }
        let sizing = KvSizing {
            layout: v.layout(),
            num_layers: 18,
            max_context: 32768,
            block_size: 16,
            max_tokens: 2048,
        };
        // The same memory as 100 blocks of all 18 layers.
        assert_eq!(sizing.pages_for_tokens(1600), 600);
        // The profiling step: 128 blocks of 6 pages.
        assert_eq!(sizing.need(), 128 * 6);
        // A long sequence holds the sliding group's window and a chunk.
        assert_eq!(sizing.capacity_tokens(600), 1600);
        let sliding = ((512 + 2048) / 16 + 1) * 5;
        assert_eq!(sizing.capacity_tokens(2000), (2000 - sliding) * 16);
    }

    #[test]
    fn a_sliding_view_lists_its_part_of_each_block_and_scratch_for_freed_ones() {
        let v = gemma();
        let mut pool = ingot_kv_cache::BlockPool::with_layout(300, 16, v.layout().clone(), false);
        let mut tables = pool.new_tables();
        pool.reserve_groups(&mut tables, 0, 560).unwrap();
        // Decoding at 543: sliding blocks 0 and 1 left the 512 window.
        pool.reserve_groups(&mut tables, 543, 560).unwrap();
        let (global, sliding) = (tables[0].blocks(), tables[1].blocks());
        assert_eq!((global.len(), sliding.len()), (35, 35 * 5));
        assert!(sliding[..10].iter().all(|&p| p == NULL_BLOCK));
        let chunk = SequenceChunk::with_tables(&[1], 543, &tables);
        assert_eq!(v.pages(&chunk, 0, 999).collect::<Vec<_>>(), global);
        for part in 0..5 {
            let pages: Vec<u32> = v.pages(&chunk, 1 + part, 999).collect();
            assert_eq!(pages.len(), 35);
            assert_eq!(pages[..2], [999, 999], "part {part}");
            for (b, &page) in pages.iter().enumerate().skip(2) {
                assert_eq!(page, sliding[b * 5 + part], "part {part} block {b}");
                assert_eq!(v.page(&chunk, 1 + part, b, 999), page);
            }
        }
        assert_eq!(v.page(&chunk, 2, 1, 999), 999);
        assert_eq!(v.blocks_of(&chunk), 35);
    }
}
