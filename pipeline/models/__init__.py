"""The estimators (KernelRidge, KernelRidgeCV, KernelPerceptron), model selection
and the fitted-model artifact. Import from the defining modules."""
