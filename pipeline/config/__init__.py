"""What a build is asked for: recipes, the version lock, GPU targets and the project's folders."""
