//! The reasons a program gives in its conditions and Events, each defined once: a reason seen
//! in `kubectl describe` leads to its one definition.

/// Defines `Reason`: an enum whose variants' names are the reasons' texts, with `ALL`,
/// `as_str`, `parse` and `Display`. Each program declares its own with this, so a reason is spelled
/// once, where it is documented.
#[macro_export]
macro_rules! reasons {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// A reason, as Kubernetes shows it (its variant's name).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason { $( $(#[$doc])* $name, )* }

        impl Reason {
            pub const ALL: &[Self] = &[$(Self::$name,)*];

            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$name => stringify!($name),)* }
            }

            /// The reason a condition or Event gives, if it is one of these.
            pub fn parse(text: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|reason| reason.as_str() == text)
            }
        }

        impl ::std::fmt::Display for Reason {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// The reasons `text` does not name in backticks: a test of each program holds its maps (the
/// crate's, the operator's page) to its reasons with this.
pub fn unnamed_in<'a>(reasons: impl IntoIterator<Item = &'a str>, text: &str) -> Vec<&'a str> {
    reasons
        .into_iter()
        .filter(|reason| !text.contains(&format!("`{reason}`")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_counts_as_named_only_in_backticks() {
        let text = "`Cleaning` holds the node; Done is not quoted";
        assert_eq!(
            unnamed_in(["Cleaning", "Done", "Pending"], text),
            ["Done", "Pending"]
        );
    }
}
