//! Asynchronous events as the messages carry them: `enum ibv_event_type` values (verbs.h)
//! and the element each names.

/// IBV_EVENT_CQ_ERR (verbs.h `enum ibv_event_type`).
pub const EV_CQ_ERR: u32 = 0;
/// IBV_EVENT_QP_FATAL.
pub const EV_QP_FATAL: u32 = 1;
/// IBV_EVENT_QP_REQ_ERR.
pub const EV_QP_REQ_ERR: u32 = 2;
/// IBV_EVENT_QP_ACCESS_ERR.
pub const EV_QP_ACCESS_ERR: u32 = 3;
/// IBV_EVENT_COMM_EST.
pub const EV_COMM_EST: u32 = 4;
/// IBV_EVENT_SQ_DRAINED.
pub const EV_SQ_DRAINED: u32 = 5;
/// IBV_EVENT_DEVICE_FATAL.
pub const EV_DEVICE_FATAL: u32 = 8;
/// IBV_EVENT_PORT_ACTIVE.
pub const EV_PORT_ACTIVE: u32 = 9;
/// IBV_EVENT_PORT_ERR.
pub const EV_PORT_ERR: u32 = 10;
/// IBV_EVENT_SRQ_LIMIT_REACHED.
pub const EV_SRQ_LIMIT_REACHED: u32 = 15;
/// IBV_EVENT_QP_LAST_WQE_REACHED.
pub const EV_QP_LAST_WQE_REACHED: u32 = 16;

/// The wire value of an unaffiliated event (`None`: an event of one object, which goes
/// only to the object's owner, [`encode_qp_event`] / CQ_ERR).
pub fn encode_event(e: &crate::proto::AsyncEvent) -> Option<u32> {
    use crate::proto::AsyncEvent as E;
    match e {
        E::PortActive(_) => Some(EV_PORT_ACTIVE),
        E::PortErr(_) => Some(EV_PORT_ERR),
        E::DeviceFatal => Some(EV_DEVICE_FATAL),
        _ => None,
    }
}

/// The wire value and the QP of an event of one QP (`None` for any other event).
pub fn encode_qp_event(e: &crate::proto::AsyncEvent) -> Option<(u32, crate::wire::Qpn)> {
    use crate::proto::AsyncEvent as E;
    match *e {
        E::QpFatal(q) => Some((EV_QP_FATAL, q)),
        E::QpReqErr(q) => Some((EV_QP_REQ_ERR, q)),
        E::QpAccessErr(q) => Some((EV_QP_ACCESS_ERR, q)),
        E::CommEst(q) => Some((EV_COMM_EST, q)),
        E::SqDrained(q) => Some((EV_SQ_DRAINED, q)),
        E::QpLastWqeReached(q) => Some((EV_QP_LAST_WQE_REACHED, q)),
        _ => None,
    }
}

/// The event of a wire value and its element (untrusted: `None` for anything else).
/// A QP's event names the QPN (the client's QP has the engine's number); CQ_ERR names
/// the client's handle of the CQ, which is what the client's `Cq::engine_cq` returns;
/// SRQ_LIMIT_REACHED the client's handle of the SRQ (its `Srq::srq_num`).
pub fn decode_event(v: u32, element: u32) -> Option<crate::proto::AsyncEvent> {
    use crate::proto::AsyncEvent as E;
    let q = crate::wire::Qpn::new(element);
    match v {
        EV_PORT_ACTIVE => Some(E::PortActive(1)),
        EV_PORT_ERR => Some(E::PortErr(1)),
        EV_DEVICE_FATAL => Some(E::DeviceFatal),
        EV_QP_FATAL => Some(E::QpFatal(q)),
        EV_QP_REQ_ERR => Some(E::QpReqErr(q)),
        EV_QP_ACCESS_ERR => Some(E::QpAccessErr(q)),
        EV_COMM_EST => Some(E::CommEst(q)),
        EV_SQ_DRAINED => Some(E::SqDrained(q)),
        EV_QP_LAST_WQE_REACHED => Some(E::QpLastWqeReached(q)),
        EV_CQ_ERR => Some(E::CqErr(crate::proto::Cq(element))),
        EV_SRQ_LIMIT_REACHED => Some(E::SrqLimitReached(crate::proto::Srq(element))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_forwarded_event_round_trips_and_unknown_values_are_refused() {
        use crate::proto::AsyncEvent as E;
        let q = crate::wire::Qpn::new(0x12_3456);
        for e in [
            E::QpFatal(q),
            E::QpReqErr(q),
            E::QpAccessErr(q),
            E::CommEst(q),
            E::SqDrained(q),
            E::QpLastWqeReached(q),
        ] {
            let (v, n) = encode_qp_event(&e).unwrap();
            assert_eq!(encode_event(&e), None, "{e:?} goes to its owner only");
            assert_eq!(decode_event(v, n.value()), Some(e));
        }
        assert_eq!(
            decode_event(EV_CQ_ERR, 7),
            Some(E::CqErr(crate::proto::Cq(7)))
        );
        for e in [E::PortActive(1), E::PortErr(1), E::DeviceFatal] {
            assert_eq!(decode_event(encode_event(&e).unwrap(), 1), Some(e));
            assert_eq!(encode_qp_event(&e), None);
        }
        assert_eq!(
            decode_event(EV_SRQ_LIMIT_REACHED, 3),
            Some(E::SrqLimitReached(crate::proto::Srq(3)))
        );
        // Unknown and garbage values: nothing.
        for v in [6, 7, 11, 12, 17, u32::MAX] {
            assert_eq!(decode_event(v, 1), None, "{v}");
        }
    }
}
