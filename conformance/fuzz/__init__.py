"""`pgspec fuzz`: search an implementation for disagreements with the spec that the golden corpus
does not hold, shrink each to a minimal example, and keep it as a case definition."""
