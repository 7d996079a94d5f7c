"""Commands around runs that are not the run itself: plan, ladder, mixture, decay branches."""
