// main.js: draw the page of this kind.
window.pagetrace = { doc: DOC };
if (KIND === "run") tokenPage(runModel(DOC));
else if (KIND === "replay") tokenPage(replayModel(DOC));
else if (KIND === "simulate") simulatePage(DOC);
else if (KIND === "lookup") lookupPage(DOC);
document.body.dataset.ready = "1";
