//! What a render made, as files to write.

/// What a render made: files by their path relative to the output directory, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub files: Vec<(String, String)>,
}
