package oncesqs
