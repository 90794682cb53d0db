use dsm_ahb::*;
fn ev(op: Op, sem: usize, seq: Option<u32>, paired: Option<(usize, u32)>) -> TraceEvent {
    TraceEvent {
        op,
        sem,
        seq,
        paired,
    }
}
fn main() {
    let mut t = Trace::new(3);
    t.sem_names = vec!["a".into()];
    t.initial = vec![0];
    t.events[0] = vec![
        ev(Op::Wait, 0, None, Some((1, 0))),
        ev(Op::Signal, 0, Some(0), None),
        ev(Op::Signal, 0, Some(1), None),
        ev(Op::Wait, 0, None, Some((0, 0))),
    ];
    t.events[1] = vec![
        ev(Op::Signal, 0, Some(0), None),
        ev(Op::Signal, 0, Some(1), None),
    ];
    t.events[2] = vec![
        ev(Op::Wait, 0, None, Some((1, 1))),
        ev(Op::Signal, 0, Some(0), None),
        ev(Op::Signal, 0, Some(1), None),
    ];
    println!("exact {:?}", brute_force(&t, 1 << 20).unwrap());
    for d in 0..4 {
        println!("d{d}    {:?}", analyse(&t, d).unwrap());
    }
}
