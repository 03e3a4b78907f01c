//! Discovery and the queue plan.

mod common;

use hetero_vulkan::{vk, DeviceType, QueueFamilyInfo, QueuePlan};

#[test]
fn lists_devices_with_their_properties() {
    let Some(instance) = common::instance() else {
        return;
    };
    let devices = instance.list_devices().expect("list devices");
    assert!(!devices.is_empty());
    for (i, d) in devices.iter().enumerate() {
        println!("{d}");
        assert_eq!(d.index, i);
        assert!(!d.name.is_empty());
        assert!(d.api_version.major >= 1);
        assert!(!d.queue_families.is_empty());
        assert!(d
            .queue_families
            .iter()
            .any(|q| q.flags.contains(vk::QueueFlags::COMPUTE)));
        assert!(!d.memory_heaps.is_empty() && !d.memory_types.is_empty());
        assert!(d
            .memory_types
            .iter()
            .all(|t| (t.heap as usize) < d.memory_heaps.len()));
        assert!(
            d.limits.max_push_constants_size >= 128,
            "Vulkan guarantees 128"
        );
        assert!(d.limits.non_coherent_atom_size >= 1);
        let text = d.to_string();
        assert!(text.contains(&d.name) && text.contains("features:") && text.contains("heaps:"));
    }
}

#[test]
fn lavapipe_is_described_as_a_cpu_with_the_expected_features() {
    let Some(instance) = common::instance() else {
        return;
    };
    let devices = instance.list_devices().expect("list devices");
    let Some(lvp) = devices.iter().find(|d| d.driver_name == "llvmpipe") else {
        eprintln!(
            "skipping: lavapipe is not among {:?}",
            devices.iter().map(|d| &d.name).collect::<Vec<_>>()
        );
        return;
    };
    assert_eq!(lvp.device_type, DeviceType::Cpu);
    assert!(lvp.features.timeline_semaphore && lvp.features.synchronization2);
    assert!(lvp.features.push_descriptor && lvp.features.buffer_device_address);
    assert!(!lvp.features.sparse_binding);
    assert!(lvp.limits.min_imported_host_pointer_alignment.is_some());
}

#[test]
fn the_queue_plan_aliases_on_one_queue() {
    let Some(gpu) = common::gpu() else { return };
    let plan = gpu.queue_plan();
    println!("{plan}");
    let families = &gpu.info().queue_families;
    if families.len() == 1 && families[0].count == 1 {
        assert!(plan.compute.aliased && plan.transfer.aliased);
        assert_eq!(
            (plan.compute.family, plan.compute.index),
            (plan.transfer.family, plan.transfer.index)
        );
        assert!(plan.to_string().contains("(aliased)"));
    }
    assert!(plan.compute.flags.contains(vk::QueueFlags::COMPUTE));
}

fn fam(flags: vk::QueueFlags, count: u32) -> QueueFamilyInfo {
    QueueFamilyInfo {
        flags,
        count,
        timestamp_valid_bits: 64,
    }
}

#[test]
fn the_queue_plan_follows_iree_rules() {
    use vk::QueueFlags as Q;
    let gct = Q::GRAPHICS | Q::COMPUTE | Q::TRANSFER;
    // A discrete GPU: graphics family, async compute family, copy engines.
    let plan = QueuePlan::choose(&[
        fam(gct, 1),
        fam(Q::COMPUTE | Q::TRANSFER, 4),
        fam(Q::TRANSFER, 2),
    ])
    .expect("plan");
    assert_eq!(
        (
            plan.compute.family,
            plan.compute.index,
            plan.compute.aliased
        ),
        (1, 0, false)
    );
    assert_eq!(
        (
            plan.transfer.family,
            plan.transfer.index,
            plan.transfer.aliased
        ),
        (2, 0, false)
    );
    // No copy engine: the second queue of the compute family.
    let plan = QueuePlan::choose(&[fam(gct, 2)]).expect("plan");
    assert_eq!(
        (
            plan.transfer.family,
            plan.transfer.index,
            plan.transfer.aliased
        ),
        (0, 1, false)
    );
    // One queue: aliased.
    let plan = QueuePlan::choose(&[fam(gct, 1)]).expect("plan");
    assert!(plan.compute.aliased && plan.transfer.aliased);
    // No compute at all: no plan.
    assert!(QueuePlan::choose(&[fam(Q::TRANSFER, 1)]).is_none());
}
