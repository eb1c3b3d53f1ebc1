//! Which of a node's VolumeAttachments the pods that stay on it still use, resolved as the
//! attach/detach controller resolves a pod's volumes (`pkg/volume/util.CreateVolumeSpec`): a
//! claim's bound PersistentVolume, a generic ephemeral volume's claim `<pod>-<volume>` only when
//! that pod controls it, and inline volumes that an attacher may serve.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;

/// What the staying pods keep attached.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Staying {
    volumes: HashSet<String>,
    inline: bool,
}

impl Staying {
    /// Whether `attachment` belongs to a pod that stays. An attachment without a PV name
    /// (an inline volume migrated to CSI) cannot be matched to its pod, so it stays whenever
    /// a staying pod has an inline volume an attacher may serve.
    pub fn keeps(&self, attachment: &VolumeAttachment) -> bool {
        match &attachment.spec.source.persistent_volume_name {
            Some(volume) => self.volumes.contains(volume),
            None => self.inline,
        }
    }

    /// Reads the claims of `pods` (each one GET: the claim must be the one bound now, not a
    /// cached one) and collects their volumes.
    pub async fn of(client: &kube::Client, pods: &[Arc<Pod>]) -> Result<Self, kube::Error> {
        let mut staying = Self::default();
        for pod in pods {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
            for volume in pod
                .spec
                .iter()
                .flat_map(|spec| spec.volumes.iter().flatten())
            {
                let Some(claim) = ClaimRef::of(pod, volume) else {
                    staying.inline |= attachable_inline(volume);
                    continue;
                };
                let Some(found) = claims.get_opt(&claim.name).await? else {
                    continue;
                };
                if claim.ephemeral && !controlled_by(&found, pod) {
                    // Another object's claim of that name: the pod never mounts it (the
                    // kubelet refuses), and the attach/detach controller does not count it.
                    continue;
                }
                staying
                    .volumes
                    .extend(found.spec.and_then(|spec| spec.volume_name));
            }
        }
        Ok(staying)
    }
}

/// The claim a pod volume names, if it names one.
struct ClaimRef {
    name: String,
    ephemeral: bool,
}

impl ClaimRef {
    fn of(pod: &Pod, volume: &Volume) -> Option<Self> {
        if let Some(claim) = &volume.persistent_volume_claim {
            return Some(Self {
                name: claim.claim_name.clone(),
                ephemeral: false,
            });
        }
        volume.ephemeral.as_ref()?;
        // The ephemeral volume controller's name (`ephemeral.VolumeClaimName`).
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        Some(Self {
            name: format!("{pod_name}-{}", volume.name),
            ephemeral: true,
        })
    }
}

fn controlled_by(claim: &PersistentVolumeClaim, pod: &Pod) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| {
            owner.controller == Some(true) && Some(&owner.uid) == pod.metadata.uid.as_ref()
        })
}

/// Whether an inline volume may be served by a VolumeAttachment: anything but the volume
/// kinds the kubelet provides itself.
fn attachable_inline(volume: &Volume) -> bool {
    volume.config_map.is_none()
        && volume.secret.is_none()
        && volume.projected.is_none()
        && volume.downward_api.is_none()
        && volume.empty_dir.is_none()
        && volume.host_path.is_none()
        && volume.image.is_none()
}

/// Drops from a cached VolumeAttachment what the controllers never read (managedFields, the
/// attacher's status): they go by which node and volume it names.
pub fn trim_for_cache(attachment: &mut VolumeAttachment) {
    attachment.metadata.managed_fields = None;
    attachment.status = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attachment(volume: Option<&str>) -> VolumeAttachment {
        let source = match volume {
            Some(volume) => json!({"persistentVolumeName": volume}),
            None => json!({"inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"}}}),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "a"},
            "spec": {"attacher": "d", "nodeName": "n", "source": source},
        }))
        .unwrap()
    }

    fn volume(source: &serde_json::Value) -> Volume {
        let mut body = json!({"name": "v"});
        for (key, value) in source.as_object().unwrap() {
            body[key] = value.clone();
        }
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn attachments_without_a_pv_stay_only_while_a_staying_pod_has_an_inline_volume() {
        let staying = Staying {
            volumes: ["pv-1".to_owned()].into(),
            inline: false,
        };
        assert!(staying.keeps(&attachment(Some("pv-1"))));
        assert!(!staying.keeps(&attachment(Some("pv-2"))));
        assert!(
            !staying.keeps(&attachment(None)),
            "no staying pod has an inline volume: the wait is for it"
        );
        let inline = Staying {
            volumes: HashSet::new(),
            inline: true,
        };
        assert!(inline.keeps(&attachment(None)));
    }

    #[test]
    fn only_volumes_an_attacher_may_serve_count_as_inline() {
        for kubelet_own in [
            json!({"configMap": {"name": "c"}}),
            json!({"secret": {"secretName": "s"}}),
            json!({"projected": {"sources": []}}),
            json!({"emptyDir": {}}),
            json!({"downwardAPI": {}}),
            json!({"hostPath": {"path": "/x"}}),
        ] {
            assert!(!attachable_inline(&volume(&kubelet_own)), "{kubelet_own}");
        }
        assert!(attachable_inline(&volume(
            &json!({"csi": {"driver": "ebs.csi.aws.com"}})
        )));
        assert!(attachable_inline(&volume(
            &json!({"awsElasticBlockStore": {"volumeID": "vol-1"}})
        )));
    }

    #[test]
    fn claims_are_named_as_the_controllers_name_them_and_ephemeral_ones_must_be_the_pods() {
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": "web-0", "uid": "u1"}, "spec": {"containers": []}}),
        )
        .unwrap();
        let named = ClaimRef::of(
            &pod,
            &volume(&json!({"persistentVolumeClaim": {"claimName": "data-web-0"}})),
        )
        .unwrap();
        assert_eq!(
            (named.name.as_str(), named.ephemeral),
            ("data-web-0", false)
        );
        let scratch = ClaimRef::of(
            &pod,
            &volume(&json!({"ephemeral": {"volumeClaimTemplate": {"spec": {}}}})),
        )
        .unwrap();
        assert_eq!(
            (scratch.name.as_str(), scratch.ephemeral),
            ("web-0-v", true)
        );
        assert!(ClaimRef::of(&pod, &volume(&json!({"emptyDir": {}}))).is_none());
        let claim = |owner: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(
                json!({"metadata": {"name": "web-0-v", "ownerReferences": owner}}),
            )
            .unwrap()
        };
        let owner = |uid: &str, controller: bool| json!([{"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": uid, "controller": controller}]);
        assert!(controlled_by(&claim(owner("u1", true)), &pod));
        assert!(!controlled_by(&claim(owner("u1", false)), &pod));
        assert!(
            !controlled_by(&claim(owner("u0", true)), &pod),
            "an earlier namesake's claim"
        );
        assert!(!controlled_by(&claim(json!(null)), &pod));
    }
}
