// explain.js: a short "what am I looking at" for each page, with this page's own numbers.
