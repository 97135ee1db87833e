//! Evaluation on the test set: loss, accuracy and, for binary tasks, the area under the ROC
//! curve; and the training figures of the clocks since the last evaluation.

/// Training loss and accuracy since the last evaluation.
#[derive(Debug, Default)]
pub struct Window {
    examples: usize,
    loss: f64,
    correct: usize,
}

impl Window {
    pub fn add(&mut self, n: usize, loss: f64, correct: usize) {
        self.examples += n;
        self.loss += loss;
        self.correct += correct;
    }

    pub fn loss(&self) -> f64 {
        self.loss / self.examples.max(1) as f64
    }

    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.examples.max(1) as f64
    }
}

/// Area under the ROC curve of (score, 0/1 label) pairs: the chance that a random positive
/// scores above a random negative (ties count half).
pub fn auc(scored: &mut [(f32, u32)]) -> f64 {
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let pos = scored.iter().filter(|s| s.1 == 1).count() as f64;
    let neg = scored.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return 0.5;
    }
    // Sum of the positives' ranks, ties given their mean rank.
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < scored.len() {
        let mut j = i;
        while j < scored.len() && scored[j].0 == scored[i].0 {
            j += 1;
        }
        let mean_rank = (i + j + 1) as f64 / 2.0;
        rank_sum += mean_rank * scored[i..j].iter().filter(|s| s.1 == 1).count() as f64;
        i = j;
    }
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

#[cfg(test)]
mod tests {
    use super::auc;

    #[test]
    fn auc_of_known_rankings() {
        assert_eq!(auc(&mut [(0.1, 0), (0.4, 0), (0.35, 1), (0.8, 1)]), 0.75);
        assert_eq!(auc(&mut [(0.9, 1), (0.1, 0)]), 1.0);
        assert_eq!(auc(&mut [(0.5, 1), (0.5, 0)]), 0.5);
    }
}
