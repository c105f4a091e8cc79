//! The registry's rules for who may register: one routable session per agent id (replaced
//! only by the same identity, the replaced one kept draining), and a cap on sessions per
//! identity.

use std::net::SocketAddr;

use bridgehead_mux::Mux;
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_server::routing::registry::{RegisterError, Registration, Registry, Replaced};
use bridgehead_server::routing::router::Strategy;

fn registration(name: &str, identity: &str) -> Registration {
    Registration {
        name: name.to_owned(),
        identity: identity.to_owned(),
        identifiers: AgentIdentifiers::default(),
        peer: SocketAddr::from(([127, 0, 0, 1], 1)),
        mux: Mux::server(),
    }
}

fn names(registry: &Registry) -> Vec<String> {
    registry.views().into_iter().map(|view| view.id).collect()
}

/// Each session's id and whether it drains, in key order.
fn draining(registry: &Registry) -> Vec<(String, bool)> {
    registry
        .views()
        .into_iter()
        .map(|view| (view.id, view.draining))
        .collect()
}

#[test]
fn an_id_is_replaced_only_by_the_same_identity() {
    let registry = Registry::new(vec![Strategy::Default], 100);
    let (first, replaced) = registry.register(registration("node-a", "cert A")).unwrap();
    assert!(replaced.is_none());
    // An impostor with the same id: refused, the original stays.
    let error = registry
        .register(registration("node-a", "cert B"))
        .unwrap_err();
    assert!(matches!(error, RegisterError::IdTaken { .. }), "{error}");
    assert!(error.to_string().contains("cert A"), "{error}");
    assert_eq!(names(&registry), ["node-a"]);
    // The same agent again (a surge pod of its DaemonSet, or a reconnect before its old
    // session's death was noticed): the new one takes the id, the old one drains.
    let (second, replaced) = registry.register(registration("node-a", "cert A")).unwrap();
    assert!(matches!(replaced, Some(Replaced::Draining)), "{replaced:?}");
    assert_ne!(first, second);
    assert_eq!(
        draining(&registry),
        [("node-a".to_owned(), true), ("node-a".to_owned(), false)]
    );
    // The old session's end does not unregister its replacement, nor free its id.
    registry.unregister(first);
    assert_eq!(names(&registry), ["node-a"]);
    let error = registry
        .register(registration("node-a", "cert B"))
        .unwrap_err();
    assert!(matches!(error, RegisterError::IdTaken { .. }), "{error}");
    registry.unregister(second);
    assert!(names(&registry).is_empty());
    // Once its last session is gone, the id is free for any identity.
    registry.register(registration("node-a", "cert B")).unwrap();
    assert_eq!(names(&registry), ["node-a"]);
}

#[test]
fn sessions_per_identity_are_capped() {
    let registry = Registry::with_limits(vec![Strategy::Default], 100, 2, usize::MAX);
    let (b, _) = registry.register(registration("b", "shared")).unwrap();
    registry.register(registration("c", "shared")).unwrap();
    let error = registry.register(registration("d", "shared")).unwrap_err();
    assert_eq!(
        error,
        RegisterError::TooManySessions {
            identity: "shared".into(),
            limit: 2
        }
    );
    // Other identities are not affected; a freed place is taken again.
    registry.register(registration("e", "other")).unwrap();
    registry.unregister(b);
    registry.register(registration("d", "shared")).unwrap();
    assert_eq!(names(&registry), ["c", "e", "d"]);
    // Only that one place was freed: the identity holds its two again.
    let error = registry.register(registration("f", "shared")).unwrap_err();
    assert!(
        matches!(error, RegisterError::TooManySessions { limit: 2, .. }),
        "{error}"
    );
}
