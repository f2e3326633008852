//! Parsing `--shapes 0,3,11-14`.

/// The indices named by a comma-separated list of indices and inclusive ranges, in order,
/// each at most once; every index must be below `count`.
pub fn parse(list: &str, count: usize) -> Result<Vec<usize>, String> {
    let mut chosen = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (index(a, count)?, index(b, count)?),
            None => (index(part, count)?, index(part, count)?),
        };
        if first > last {
            return Err(format!("range {part} runs backwards"));
        }
        for i in first..=last {
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
    }
    if chosen.is_empty() {
        return Err("no shape selected".into());
    }
    Ok(chosen)
}

fn index(text: &str, count: usize) -> Result<usize, String> {
    let i: usize = text.trim().parse().map_err(|_| format!("`{text}` is not a shape number"))?;
    if i >= count {
        return Err(format!("shape {i} does not exist: the table has shapes 0 to {}", count - 1));
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse("0,3,11-14", 21).unwrap(), vec![0, 3, 11, 12, 13, 14]);
        assert_eq!(parse("5, 2-3, 3", 21).unwrap(), vec![5, 2, 3]);
        assert!(parse("21", 21).unwrap_err().contains("does not exist"));
        assert!(parse("4-2", 21).is_err());
        assert!(parse("x", 21).is_err());
        assert!(parse("", 21).is_err());
    }
}
