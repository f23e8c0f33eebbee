//! Engine features: facts about a command that only the extractor can see (how it was reached,
//! what its shape is), named once here and matched by rules (`features_any`, `features_none`).
//! Owns the names and their parsing; it may not decide anything (that is `rules`).

/// One fact the extractor records about a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feature {
    /// A function that calls itself in a pipeline or in the background.
    ForkBomb,
    /// A person confirms each action (`find -ok`, `xargs -p`).
    Interactive,
    /// The `rm` a `find -delete` stands for.
    FindDelete,
    /// `find` with `-delete` or `-exec`.
    FindAction,
    /// A wrapper that runs another command (`sudo`, `env`, `timeout`, …).
    Wrapper,
    /// A wrapper that runs its command as a user named literally who is not root
    /// (`su - postgres`, `sudo -u www-data -i`): no privilege is gained.
    NonRootUser,
}

impl Feature {
    pub const ALL: &'static [Feature] = &[
        Feature::ForkBomb,
        Feature::Interactive,
        Feature::FindDelete,
        Feature::FindAction,
        Feature::Wrapper,
        Feature::NonRootUser,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Feature::ForkBomb => "fork-bomb",
            Feature::Interactive => "interactive",
            Feature::FindDelete => "find-delete",
            Feature::FindAction => "find-action",
            Feature::Wrapper => "wrapper",
            Feature::NonRootUser => "non-root-user",
        }
    }

    /// The feature a policy file names, or an error that lists the known ones.
    pub fn parse(s: &str) -> Result<Feature, String> {
        Feature::ALL.iter().copied().find(|f| f.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Feature::ALL.iter().map(|f| f.as_str()).collect();
            format!("unknown feature `{s}` (known: {})", known.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Feature::ALL {
            assert_eq!(Feature::parse(f.as_str()), Ok(*f));
        }
        assert!(Feature::parse("fork").is_err_and(|e| e.contains("fork-bomb")));
    }
}
