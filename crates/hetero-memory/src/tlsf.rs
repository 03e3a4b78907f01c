//! The buffer level: O(1) two-level segregated-fit (TLSF) sub-allocation.
//!
//! Free blocks sit in bins indexed by (first level = floor(log2 size), second
//! level = the next 3 bits), so a request is rounded up to its bin's lower edge
//! (waste < 12.5 %) and the first non-empty bin at or above it is found with two
//! bit scans. All metadata lives in this struct (a node arena indexed by `u32`),
//! never inside the managed memory, so device memory and pinned memory can be
//! managed alike and a stale write into a freed buffer cannot corrupt the
//! allocator.
//!
//! Addresses are plain `u64`s: real virtual addresses for the pools (so
//! alignment is real alignment), or offsets for a replay. Regions are disjoint
//! address ranges; blocks merge only with neighbours in the same region.
//! Invariants: every byte of every region is in exactly one node; two free
//! nodes are never physical neighbours; a region's first node stays its first.

/// Granularity and minimum alignment: every block starts and ends on it.
pub const GRAN: u64 = 256;
const SL_BITS: u32 = 3;
const SL: usize = 1 << SL_BITS;
const FL: usize = 64;
const NIL: u32 = u32::MAX;
/// Blocks scanned in the request's own bin when the O(1) search finds nothing.
const FALLBACK_SCAN: usize = 8;

#[derive(Debug, Clone)]
struct Node {
    addr: u64,
    size: u64,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    free: bool,
    tag: u64,
}

/// Bin of a size: (first level, second level).
#[inline(always)]
fn mapping(size: u64) -> (usize, usize) {
    if size < SL as u64 {
        return (0, size as usize);
    }
    let fl = 63 - size.leading_zeros();
    let sl = (size >> (fl - SL_BITS)) as usize & (SL - 1);
    (fl as usize, sl)
}

/// `size` rounded up to the lower edge of a bin, and at least [`GRAN`].
#[inline(always)]
pub fn round_size(size: u64) -> u64 {
    let size = size.max(1).saturating_add(GRAN - 1) & !(GRAN - 1);
    let fl = 63 - size.leading_zeros();
    let step = (1u64 << (fl - SL_BITS)).max(GRAN);
    size.saturating_add(step - 1) & !(step - 1)
}

/// A dense index of the bin of a rounded size (for per-class caches).
#[inline(always)]
pub fn class_of(rounded: u64) -> usize {
    let (fl, sl) = mapping(rounded);
    fl * SL + sl
}

/// Where in a free block an allocation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// At the block's low end.
    Low,
    /// At the block's high end: large requests go here so that small and large
    /// buffers grow from opposite ends and do not interleave.
    High,
}

/// A TLSF allocator over disjoint address ranges.
#[derive(Debug, Clone)]
pub struct Tlsf {
    nodes: Vec<Node>,
    spare: Vec<u32>,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL],
    heads: [[u32; SL]; FL],
    total: u64,
    free_bytes: u64,
    free_blocks: usize,
    own_bin_first: bool,
    address_bins: usize,
}

impl Default for Tlsf {
    fn default() -> Self {
        Self::new()
    }
}

impl Tlsf {
    pub fn new() -> Self {
        Tlsf {
            nodes: Vec::new(),
            spare: Vec::new(),
            fl_bitmap: 0,
            sl_bitmap: [0; FL],
            heads: [[NIL; SL]; FL],
            total: 0,
            free_bytes: 0,
            free_blocks: 0,
            own_bin_first: true,
            address_bins: 8,
        }
    }

    fn new_node(&mut self, n: Node) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = n;
                i
            }
            None => {
                self.nodes.push(n);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 blocks")
            }
        }
    }

    fn insert_free(&mut self, i: u32) {
        let (fl, sl) = mapping(self.nodes[i as usize].size);
        let head = self.heads[fl][sl];
        {
            let n = &mut self.nodes[i as usize];
            n.free = true;
            n.prev_free = NIL;
            n.next_free = head;
        }
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        self.heads[fl][sl] = i;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
        self.free_bytes += self.nodes[i as usize].size;
        self.free_blocks += 1;
    }

    fn remove_free(&mut self, i: u32) {
        let (size, prev, next) = {
            let n = &self.nodes[i as usize];
            (n.size, n.prev_free, n.next_free)
        };
        let (fl, sl) = mapping(size);
        if prev != NIL {
            self.nodes[prev as usize].next_free = next;
        } else {
            self.heads[fl][sl] = next;
            if next == NIL {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if next != NIL {
            self.nodes[next as usize].prev_free = prev;
        }
        self.nodes[i as usize].free = false;
        self.free_bytes -= size;
        self.free_blocks -= 1;
    }

    /// Adds the range `[base, base + size)`; returns its first node, the handle
    /// [`Tlsf::remove_region`] takes back.
    pub fn add_region(&mut self, base: u64, size: u64) -> u32 {
        debug_assert!(base.is_multiple_of(GRAN) && size.is_multiple_of(GRAN) && size > 0);
        let i = self.new_node(Node {
            addr: base,
            size,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
            free: false,
            tag: 0,
        });
        self.total += size;
        self.insert_free(i);
        i
    }

    /// Whether the region whose first node is `head` is one free block.
    pub fn region_is_free(&self, head: u32) -> bool {
        let n = &self.nodes[head as usize];
        n.free && n.next_phys == NIL
    }

    /// Takes back a wholly free region; false (and nothing changes) otherwise.
    pub fn remove_region(&mut self, head: u32) -> bool {
        if !self.region_is_free(head) {
            return false;
        }
        self.remove_free(head);
        self.total -= self.nodes[head as usize].size;
        self.spare.push(head);
        true
    }

    /// First block of a bin at or above (fl, sl), O(1).
    #[inline(always)]
    fn find(&self, fl: usize, sl: usize) -> Option<u32> {
        let sl_map = self.sl_bitmap[fl] & (!0u32 << sl);
        let (fl, sl) = if sl_map != 0 {
            (fl, sl_map.trailing_zeros() as usize)
        } else {
            let fl_map = if fl + 1 >= FL {
                0
            } else {
                self.fl_bitmap & (!0u64 << (fl + 1))
            };
            if fl_map == 0 {
                return None;
            }
            let fl = fl_map.trailing_zeros() as usize;
            (fl, self.sl_bitmap[fl].trailing_zeros() as usize)
        };
        Some(self.heads[fl][sl])
    }

    /// The smallest of the first [`FALLBACK_SCAN`] blocks of a bin that fits.
    fn best_in_bin(&self, (fl, sl): (usize, usize), size: u64, align: u64) -> Option<u32> {
        let mut i = self.heads[fl][sl];
        let mut best: Option<u32> = None;
        for _ in 0..FALLBACK_SCAN {
            if i == NIL {
                break;
            }
            if self.fits(i, size, align).is_some()
                && best.is_none_or(|b| self.nodes[i as usize].size < self.nodes[b as usize].size)
            {
                best = Some(i);
            }
            i = self.nodes[i as usize].next_free;
        }
        best
    }

    /// Among the first `bins` non-empty bins at or above (fl, sl), the lowest
    /// addressed of their first few blocks: a bounded, O(1) approximation of
    /// address-ordered first fit, which keeps buffers packed towards low
    /// addresses so that frees at the top merge into one large free block.
    fn lowest_fitting(&self, fl: usize, sl: usize, size: u64, align: u64) -> Option<u32> {
        let mut best: Option<u32> = None;
        self.first_blocks_of_bins(fl, sl, self.address_bins, |i| {
            if self.fits(i, size, align).is_some()
                && best.is_none_or(|b| self.nodes[i as usize].addr < self.nodes[b as usize].addr)
            {
                best = Some(i);
            }
        });
        best
    }

    /// Calls `f` on the first few (up to 4) blocks of each of the first `bins`
    /// non-empty bins at or above (fl, sl), in bin order.
    fn first_blocks_of_bins(&self, fl: usize, sl: usize, bins: usize, mut f: impl FnMut(u32)) {
        let (mut fl, mut sl) = (fl, sl);
        for _ in 0..bins {
            let sl_map = self.sl_bitmap[fl] & (!0u32).checked_shl(sl as u32).unwrap_or(0);
            let (bf, bs) = if sl_map != 0 {
                (fl, sl_map.trailing_zeros() as usize)
            } else {
                let fl_map = if fl + 1 >= FL {
                    0
                } else {
                    self.fl_bitmap & (!0u64 << (fl + 1))
                };
                if fl_map == 0 {
                    break;
                }
                let bf = fl_map.trailing_zeros() as usize;
                (bf, self.sl_bitmap[bf].trailing_zeros() as usize)
            };
            let mut i = self.heads[bf][bs];
            for _ in 0..4 {
                if i == NIL {
                    break;
                }
                f(i);
                i = self.nodes[i as usize].next_free;
            }
            (fl, sl) = if bs + 1 < SL {
                (bf, bs + 1)
            } else if bf + 1 < FL {
                (bf + 1, 0)
            } else {
                break;
            };
        }
    }

    /// How many bins [`Tlsf::alloc`] compares by address (default 8; 0: plain
    /// good fit, like a textbook TLSF).
    pub fn set_address_bins(&mut self, bins: usize) {
        self.address_bins = bins;
    }

    /// Whether to try the request's own bin before the O(1) good-fit search
    /// (on by default; off behaves like a textbook TLSF).
    pub fn set_own_bin_first(&mut self, on: bool) {
        self.own_bin_first = on;
    }

    fn fits(&self, i: u32, size: u64, align: u64) -> Option<u64> {
        let n = &self.nodes[i as usize];
        let addr = (n.addr + align - 1) & !(align - 1);
        (addr + size <= n.addr + n.size).then_some(addr)
    }

    /// Allocates `size` bytes (rounded up to [`GRAN`]) aligned to `align` (a power
    /// of two). Blocks larger than `no_split_above` are handed out whole, and only
    /// when that wastes at most 1/8 of the request. Returns (node, address).
    pub fn alloc(
        &mut self,
        size: u64,
        align: u64,
        placement: Placement,
        no_split_above: u64,
    ) -> Option<(u32, u64)> {
        let size = size.max(1).checked_add(GRAN - 1)? & !(GRAN - 1);
        let align = align.max(GRAN);
        let need = size.checked_add(align - GRAN)?;
        let own = mapping(need);
        let (fl, sl) = mapping(round_size(need));
        // Best fit among the first blocks of the request's own bin: they are the
        // tightest fits, and leaving them unused is what fragments a TLSF.
        let mut block = if self.own_bin_first && own != (fl, sl) {
            self.best_in_bin(own, size, align)
        } else {
            None
        };
        if block.is_none() {
            block = if self.address_bins > 0 {
                self.lowest_fitting(fl, sl, size, align)
            } else {
                self.find(fl, sl)
            };
        }
        if block.is_none() && !self.own_bin_first {
            block = self.best_in_bin(own, size, align);
        }
        let block = block?;
        let (s, bsize) = (
            self.nodes[block as usize].addr,
            self.nodes[block as usize].size,
        );
        if bsize > no_split_above {
            if bsize - size > size / 8 || s % align != 0 {
                return None;
            }
            self.remove_free(block);
            return Some((block, s));
        }
        let e = s + bsize;
        let addr = match placement {
            Placement::Low => (s + align - 1) & !(align - 1),
            Placement::High => (e - size) & !(align - 1),
        };
        debug_assert!(addr >= s && addr + size <= e);
        self.remove_free(block);
        Some((self.carve(block, addr, size), addr))
    }

    /// Allocates like [`Tlsf::alloc`] (always splitting), but the caller
    /// chooses: among the free blocks the search looks at (the first few of
    /// the request's own bin and of the first address bins at or above it,
    /// each one that fits), `score(start, end)` gives the cost of the block
    /// `[start, end)` and the address in it to place the request at (aligned,
    /// `size` bytes inside the block); the lowest cost wins, then the lowest
    /// address. Returns (node, address).
    pub fn alloc_scored(
        &mut self,
        size: u64,
        align: u64,
        mut score: impl FnMut(u64, u64) -> (u64, u64),
    ) -> Option<(u32, u64)> {
        let size = size.max(1).checked_add(GRAN - 1)? & !(GRAN - 1);
        let align = align.max(GRAN);
        let need = size.checked_add(align - GRAN)?;
        let mut best: Option<(u64, u64, u32)> = None;
        let mut consider = |t: &Self, i: u32| {
            if t.fits(i, size, align).is_none() {
                return;
            }
            let n = &t.nodes[i as usize];
            let (cost, addr) = score(n.addr, n.addr + n.size);
            let inside = addr.is_multiple_of(align)
                && addr >= n.addr
                && addr.checked_add(size).is_some_and(|e| e <= n.addr + n.size);
            if inside && best.is_none_or(|(c, a, _)| (cost, addr) < (c, a)) {
                best = Some((cost, addr, i));
            }
        };
        let own = mapping(need);
        let mut i = self.heads[own.0][own.1];
        for _ in 0..FALLBACK_SCAN {
            if i == NIL {
                break;
            }
            consider(self, i);
            i = self.nodes[i as usize].next_free;
        }
        let (fl, sl) = mapping(round_size(need));
        self.first_blocks_of_bins(fl, sl, self.address_bins.max(1), |i| consider(self, i));
        let (_, addr, block) = best?;
        self.remove_free(block);
        Some((self.carve(block, addr, size), addr))
    }

    /// Splits the (unlisted) block `b` so `[addr, addr + size)` is one used node;
    /// the rest goes back to the bins. `b` stays the front-most piece.
    fn carve(&mut self, b: u32, addr: u64, size: u64) -> u32 {
        let (s, e) = {
            let n = &self.nodes[b as usize];
            (n.addr, n.addr + n.size)
        };
        let mut used = b;
        if addr > s {
            used = self.split(b, addr);
            self.insert_free(b);
        }
        if addr + size < e {
            let tail = self.split(used, addr + size);
            self.insert_free(tail);
        }
        used
    }

    /// Frees a used node, merging it with free neighbours.
    pub fn free(&mut self, i: u32) {
        debug_assert!(!self.nodes[i as usize].free, "double free of a TLSF node");
        let mut i = i;
        let next = self.nodes[i as usize].next_phys;
        if next != NIL && self.nodes[next as usize].free {
            self.remove_free(next);
            self.absorb(i, next);
        }
        let prev = self.nodes[i as usize].prev_phys;
        if prev != NIL && self.nodes[prev as usize].free {
            self.remove_free(prev);
            self.absorb(prev, i);
            i = prev;
        }
        self.insert_free(i);
    }

    /// Splits node `b` at `at` (inside it): `b` keeps `[b.addr, at)`, a new
    /// unlisted node, returned, takes the rest.
    fn split(&mut self, b: u32, at: u64) -> u32 {
        let (addr, end, next) = {
            let n = &self.nodes[b as usize];
            (n.addr, n.addr + n.size, n.next_phys)
        };
        let t = self.new_node(Node {
            addr: at,
            size: end - at,
            prev_phys: b,
            next_phys: next,
            prev_free: NIL,
            next_free: NIL,
            free: false,
            tag: 0,
        });
        if next != NIL {
            self.nodes[next as usize].prev_phys = t;
        }
        self.nodes[b as usize].next_phys = t;
        self.nodes[b as usize].size = at - addr;
        t
    }

    /// Merges node `right`, the physical successor of `left`, into `left`; the
    /// slot of `right` becomes spare. Neither may be in a free list.
    fn absorb(&mut self, left: u32, right: u32) {
        let (size, next) = (
            self.nodes[right as usize].size,
            self.nodes[right as usize].next_phys,
        );
        self.nodes[left as usize].size += size;
        self.nodes[left as usize].next_phys = next;
        if next != NIL {
            self.nodes[next as usize].prev_phys = left;
        }
        self.spare.push(right);
    }

    /// Size in bytes of node `i` (used or free).
    pub fn size_of(&self, i: u32) -> u64 {
        self.nodes[i as usize].size
    }

    /// Sets a caller-defined tag on a used node (the pool stores the stream).
    pub fn set_tag(&mut self, i: u32, tag: u64) {
        self.nodes[i as usize].tag = tag;
    }

    /// Bytes under management.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of free blocks.
    pub fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    /// The largest free block: a scan of the highest non-empty bin only.
    pub fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut i = self.heads[fl][sl];
        let mut best = 0;
        while i != NIL {
            best = best.max(self.nodes[i as usize].size);
            i = self.nodes[i as usize].next_free;
        }
        best
    }

    /// 1 − largest free / total free; 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            return 0.0;
        }
        1.0 - self.largest_free() as f64 / self.free_bytes as f64
    }

    /// The blocks of the region starting at `head`: (address, size, free, tag).
    pub fn region_blocks(&self, head: u32) -> impl Iterator<Item = (u64, u64, bool, u64)> + '_ {
        let mut i = head;
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let n = &self.nodes[i as usize];
            i = n.next_phys;
            Some((n.addr, n.size, n.free, n.tag))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rounding_waste_is_at_most_an_eighth() {
        for s in (2048u64..1 << 22).step_by(997) {
            let r = round_size(s);
            assert!(r >= s && (r - s) * 8 <= s, "{s} -> {r}");
        }
        assert_eq!(round_size(1), 256);
        assert_eq!(round_size(4096), 4096);
    }

    #[test]
    fn alloc_scored_takes_the_cheapest_candidate_and_its_address() {
        let mut t = Tlsf::new();
        t.add_region(0, 1 << 20);
        let (a, _) = t.alloc(4096, 256, Placement::Low, u64::MAX).expect("a");
        let (_b, _) = t.alloc(4096, 256, Placement::Low, u64::MAX).expect("b");
        let (c, _) = t.alloc(4096, 256, Placement::Low, u64::MAX).expect("c");
        t.free(a);
        t.free(c);
        // Free: [0, 4096) and [8192, 1 MiB). Costing the low block more, the
        // request goes to the high end of the other.
        let (n, addr) = t
            .alloc_scored(
                1024,
                256,
                |s, e| {
                    if s == 0 {
                        (1, s)
                    } else {
                        (0, e - 1024)
                    }
                },
            )
            .expect("fits");
        assert_eq!(addr, (1 << 20) - 1024);
        assert_eq!(t.size_of(n), 1024);
        // On equal cost, the lowest address; an address outside the block
        // or unaligned is not taken.
        let (_, addr) = t.alloc_scored(1024, 256, |s, _| (0, s)).expect("fits");
        assert_eq!(addr, 0);
        let (_, addr) = t
            .alloc_scored(
                1024,
                256,
                |s, _| if s == 1024 { (0, s + 1) } else { (5, s) },
            )
            .expect("fits");
        assert_eq!(
            addr, 8192,
            "the unaligned choice in [1024, 4096) is skipped"
        );
        assert!(t.alloc_scored(2 << 20, 256, |s, _| (0, s)).is_none());
    }

    #[test]
    fn alloc_free_coalesces_back_to_one_block() {
        let mut t = Tlsf::new();
        let head = t.add_region(1 << 20, 1 << 20);
        let a = t.alloc(1000, 256, Placement::Low, u64::MAX).expect("a");
        let b = t.alloc(5000, 4096, Placement::High, u64::MAX).expect("b");
        let c = t
            .alloc(300_000, 65536, Placement::Low, u64::MAX)
            .expect("c");
        assert_eq!(b.1 % 4096, 0);
        assert_eq!(c.1 % 65536, 0);
        t.free(b.0);
        t.free(a.0);
        t.free(c.0);
        assert_eq!(t.free_blocks(), 1);
        assert_eq!(t.largest_free(), 1 << 20);
        assert!(t.remove_region(head));
        assert_eq!(t.total(), 0);
    }

    #[test]
    fn unsplittable_blocks_are_whole_or_not_at_all() {
        let mut t = Tlsf::new();
        t.add_region(0, 8 << 20);
        assert!(t.alloc(1 << 20, 256, Placement::Low, 4 << 20).is_none());
        let (n, _) = t
            .alloc(7 << 20 | 512 << 10, 256, Placement::Low, 4 << 20)
            .expect("whole");
        assert_eq!(t.size_of(n), 8 << 20);
    }

    proptest! {
        /// Random alloc/free against a model: no overlap, alignment honoured,
        /// every byte accounted for, and all frees coalesce to one block.
        #[test]
        fn model(ops in prop::collection::vec((any::<bool>(), 1u64..200_000, 0u32..8, any::<bool>(), any::<prop::sample::Index>()), 1..300)) {
            let mut t = Tlsf::new();
            let base = 1u64 << 30;
            let cap = 8u64 << 20;
            t.add_region(base, cap);
            let mut live: Vec<(u32, u64, u64)> = Vec::new();
            for (is_alloc, size, align_pow, high, idx) in ops {
                if is_alloc || live.is_empty() {
                    let align = 256u64 << align_pow;
                    let placement = if high { Placement::High } else { Placement::Low };
                    if let Some((n, addr)) = t.alloc(size, align, placement, u64::MAX) {
                        prop_assert_eq!(addr % align, 0);
                        prop_assert!(addr >= base && addr + size <= base + cap);
                        let len = t.size_of(n);
                        prop_assert!(len >= size);
                        for &(_, a, l) in &live {
                            prop_assert!(addr + len <= a || a + l <= addr, "overlap");
                        }
                        live.push((n, addr, len));
                    }
                } else {
                    let (n, _, _) = live.swap_remove(idx.index(live.len()));
                    t.free(n);
                }
                let used: u64 = live.iter().map(|l| l.2).sum();
                prop_assert_eq!(used + t.free_bytes(), cap);
            }
            for (n, _, _) in live {
                t.free(n);
            }
            prop_assert_eq!(t.free_blocks(), 1);
            prop_assert_eq!(t.largest_free(), cap);
        }
    }
}
