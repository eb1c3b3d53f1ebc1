//! Reading the Query APIs' XML answers (EC2's and STS's): only the few fields we use.

use roxmltree::{Document, Node};

fn children<'a, 'input>(
    node: Node<'a, 'input>,
    name: &'static str,
) -> impl Iterator<Item = Node<'a, 'input>> {
    node.children()
        .filter(move |child| child.is_element() && child.tag_name().name() == name)
}

fn child_text(node: Node<'_, '_>, name: &'static str) -> Option<String> {
    children(node, name)
        .next()
        .and_then(|child| child.text())
        .map(str::to_owned)
}

/// The text of the first element named `name` anywhere in the document.
pub fn first_text(text: &str, name: &str) -> Option<String> {
    let document = Document::parse(text).ok()?;
    document
        .descendants()
        .find(|node| node.is_element() && node.tag_name().name() == name)
        .and_then(|node| node.text())
        .map(str::to_owned)
}

/// The first error's code and message (`<Errors><Error><Code>` in EC2's answers,
/// `<ErrorResponse><Error><Code>` in STS's).
pub fn error(text: &str) -> Option<(String, String)> {
    let document = Document::parse(text).ok()?;
    let error = document
        .descendants()
        .find(|node| node.is_element() && node.tag_name().name() == "Error")?;
    Some((
        child_text(error, "Code").unwrap_or_default(),
        child_text(error, "Message").unwrap_or_default(),
    ))
}

/// Why `text` is not EC2's answer to `action`: EC2 answers `<{action}Response>` on success
/// and `<Response><Errors><Error>` on failure. A server that is not EC2 (a wrong
/// `--aws-endpoint-url`, a proxy's page, S3) answers something else, and an answer that lists
/// no instance must never be read as "no such instance".
pub fn not_ec2_answer(text: &str, action: &str) -> Option<String> {
    let document = match Document::parse(text) {
        Ok(document) => document,
        Err(error) => return Some(format!("not XML ({error})")),
    };
    let root = document.root_element().tag_name().name();
    let expected = format!("{action}Response");
    (root != expected).then(|| format!("the answer's document is <{root}>, not EC2's <{expected}>"))
}

/// The code and message of an error in EC2's own shape (`<Response><Errors><Error>`); `None`
/// for any other document, whatever `Error` elements it has.
pub fn ec2_error(text: &str) -> Option<(String, String)> {
    let document = Document::parse(text).ok()?;
    let root = document.root_element();
    if root.tag_name().name() != "Response" {
        return None;
    }
    let error = children(root, "Errors")
        .next()
        .and_then(|errors| children(errors, "Error").next())?;
    Some((
        child_text(error, "Code").unwrap_or_default(),
        child_text(error, "Message").unwrap_or_default(),
    ))
}

/// An instance as an answer lists it: its id and state name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub state: String,
}

/// The instances of an `instancesSet` (every reservation's, for DescribeInstances), with the
/// state under `state_element` (`instanceState` when described, `currentState` after a
/// Terminate, Stop or Start); and the `nextToken` of a paged answer.
pub fn instances(
    text: &str,
    state_element: &'static str,
) -> Result<(Vec<Listed>, Option<String>), String> {
    let document = Document::parse(text).map_err(|error| format!("unreadable answer: {error}"))?;
    let root = document.root_element();
    let listed = document
        .descendants()
        .filter(|node| node.is_element() && node.tag_name().name() == "instancesSet")
        .flat_map(|set| children(set, "item"))
        .filter_map(|item| {
            let id = child_text(item, "instanceId")?;
            let state = children(item, state_element)
                .next()
                .and_then(|state| child_text(state, "name"))?;
            Some(Listed { id, state })
        })
        .collect();
    Ok((listed, child_text(root, "nextToken")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn described_instances_and_errors_are_read() {
        let described = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <reservationSet><item><instancesSet>
    <item><instanceId>i-1</instanceId><instanceState><code>16</code><name>running</name></instanceState>
      <networkInterfaceSet><item><attachment><status>attached</status></attachment></item></networkInterfaceSet></item>
    <item><instanceId>i-2</instanceId><instanceState><code>32</code><name>shutting-down</name></instanceState></item>
  </instancesSet></item></reservationSet>
  <nextToken>page2</nextToken>
</DescribeInstancesResponse>"#;
        let (listed, next) = instances(described, "instanceState").unwrap();
        assert_eq!(
            listed,
            vec![
                Listed {
                    id: "i-1".into(),
                    state: "running".into()
                },
                Listed {
                    id: "i-2".into(),
                    state: "shutting-down".into()
                },
            ]
        );
        assert_eq!(next.as_deref(), Some("page2"));
        let failed = "<Response><Errors><Error><Code>UnauthorizedOperation</Code>\
                      <Message>You are not authorized</Message></Error></Errors></Response>";
        assert_eq!(
            error(failed),
            Some((
                "UnauthorizedOperation".into(),
                "You are not authorized".into()
            ))
        );
        assert!(instances("not xml", "instanceState").is_err());
        assert_eq!(
            ec2_error(failed),
            Some((
                "UnauthorizedOperation".into(),
                "You are not authorized".into()
            ))
        );
    }

    #[test]
    fn only_ec2_documents_are_taken_for_ec2_answers() {
        let listed_nothing =
            "<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>";
        assert_eq!(not_ec2_answer(listed_nothing, "DescribeInstances"), None);
        let s3 = "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name></ListBucketResult>";
        let why = not_ec2_answer(s3, "DescribeInstances").unwrap();
        assert!(why.contains("<ListBucketResult>"), "{why}");
        assert!(not_ec2_answer("<html>ok</html>", "StopInstances").is_some());
        assert!(not_ec2_answer("plain text", "StopInstances").is_some());
        // S3's error document is not EC2's: its code is never read as EC2's.
        let s3_error = "<Error><Code>InvalidInstanceID.NotFound</Code><Message>x</Message></Error>";
        assert_eq!(ec2_error(s3_error), None);
    }
}
